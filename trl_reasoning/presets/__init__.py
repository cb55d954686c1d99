"""The presets: one module per algorithm (a config dataclass with the paper's defaults, every default sourced, and a
thin trainer subclass), and ``PRESETS``, the one list of them.

Everything that names the presets reads ``PRESETS``: the package's exports, the CLI's subcommands, the README's
tables (:mod:`trl_reasoning.presets.tables`), the recipes' tests and the tests that run every preset. Where each
preset's defaults and paper come from is :mod:`trl_reasoning.presets.provenance`. Adding a preset is its module here plus its import, its entry in ``PRESETS`` and its two names in
``__all__`` below; ``tests/presets/test_presets_list.py`` fails when any of them is missing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .cispo import CISPOConfig, CISPOTrainer
from .dapo import DAPOConfig, DAPOTrainer
from .dppo import DPPOConfig, DPPOTrainer
from .dr_grpo import DrGRPOConfig, DrGRPOTrainer
from .gspo import GSPOConfig, GSPOTrainer
from .maxrl import MaxRLConfig, MaxRLTrainer
from .prorl import ProRLConfig, ProRLTrainer
from .provenance import Paper
from .reinforce_pp import ReinforcePPConfig, ReinforcePPTrainer
from .rloo import RLOOConfig, RLOOTrainer
from .scalerl import ScaleRLConfig, ScaleRLTrainer


@dataclasses.dataclass(frozen=True)
class Preset:
    """One algorithm: its trainer class and a one-line summary; everything else is read from what the preset's module
    already declares (the trainer's ``config_class``, ``_name`` and ``paper``), so it is written once.

    Parameters:
        trainer_class (`type[ReasoningTrainer]`):
            The preset's trainer, defined in ``trl_reasoning/presets/<name>.py``.
        summary (`str`):
            What the algorithm changes, in one line, for tables (the README's, ``trl-reasoning --help``'s).
    """

    trainer_class: type[ReasoningTrainer]
    summary: str

    @property
    def name(self) -> str:
        """The CLI subcommand and the module's name: ``"dapo"`` for ``trl_reasoning/presets/dapo.py``."""
        return self.trainer_class.__module__.rsplit(".", 1)[-1]

    @property
    def display_name(self) -> str:
        """The name papers and tables use (``"Dr. GRPO"``), also the model card's."""
        return self.trainer_class._name

    @property
    def config_class(self) -> type[ReasoningConfig]:
        """The preset's config dataclass (``DAPOConfig``)."""
        return self.trainer_class.config_class

    @property
    def paper(self) -> Paper:
        """The paper the preset implements (its trainer's ``paper``)."""
        return self.trainer_class.paper

    @property
    def paper_id(self) -> str:
        """The paper's arXiv id (``"2503.14476"``)."""
        return self.paper.arxiv_id

    @property
    def paper_title(self) -> str:
        """The paper's title."""
        return self.paper.title

    def defaults(self) -> dict[str, Any]:
        """``{field: default}`` of the preset's config, for every field (``ReasoningConfig``'s and the preset's)."""
        return {f.name: f.default for f in dataclasses.fields(self.config_class)}


#: Every preset, in the order tables and the CLI list them.
PRESETS: tuple[Preset, ...] = (
    Preset(DAPOTrainer, "clip-higher, token-mean loss, dynamic sampling, soft overlong punishment"),
    Preset(CISPOTrainer, "clipped importance-sampling weights: every token keeps its gradient (MiniMax-M1's recipe)"),
    Preset(GSPOTrainer, "one length-normalised importance ratio per sequence, clipped per sequence (Qwen3's RL)"),
    Preset(ProRLTrainer, "DAPO with the KL term kept, its reference and the optimizer hard-reset periodically"),
    Preset(DPPOTrainer, "a trust region on the estimated policy divergence instead of ratio clipping"),
    Preset(MaxRLTrainer, "advantages normalized by the group's success rate (binary rewards)"),
    Preset(RLOOTrainer, "REINFORCE leave-one-out, TRL's `RLOOTrainer` math, KL in the reward"),
    Preset(ReinforcePPTrainer, "per-token KL in the return, advantages normalised over the batch (OpenRLHF's)"),
    Preset(DrGRPOTrainer, "GRPO without its length and difficulty biases"),
    Preset(ScaleRLTrainer, "the ScaleRL recipe: batch-scaled advantages, CISPO, prompt-mean loss, async rollouts"),
)

__all__ = [
    "PRESETS",
    "Preset",
    "preset",
    "CISPOConfig",
    "CISPOTrainer",
    "DAPOConfig",
    "DAPOTrainer",
    "DPPOConfig",
    "DPPOTrainer",
    "DrGRPOConfig",
    "DrGRPOTrainer",
    "GSPOConfig",
    "GSPOTrainer",
    "MaxRLConfig",
    "MaxRLTrainer",
    "ProRLConfig",
    "ProRLTrainer",
    "ReinforcePPConfig",
    "ReinforcePPTrainer",
    "RLOOConfig",
    "RLOOTrainer",
    "ScaleRLConfig",
    "ScaleRLTrainer",
]


def preset(name: str) -> Preset:
    """The preset called ``name`` on the command line (``"dapo"``, ``"dr_grpo"``); an unknown name lists the allowed
    values."""
    for entry in PRESETS:
        if entry.name == name:
            return entry
    raise ValueError(f"Unknown preset {name!r}. Allowed values: {', '.join(p.name for p in PRESETS)}.")
