"""Module paths from before the layered layout (0.1) keep importing, so that old code and pickles keep loading.

A ``training_args.bin`` saved by 0.1 pickles its config as e.g. ``trl_reasoning.dapo.DAPOConfig``; unpickling imports
that module by name. The finder below answers those names with the module's new home (the same module object, so
``isinstance`` and ``mock.patch`` see one module). Names that are packages now (``trainer``, ``rewards``,
``evaluation``, ``async_rollouts``) re-export their old public names from their ``__init__`` instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

MOVED_MODULES: dict[str, str] = {
    f"trl_reasoning.{old}": f"trl_reasoning.{new}"
    for old, new in {
        "_registry": "algorithms.registry",
        "_warnings": "utils.user_warnings",
        "advantages": "algorithms.advantages",
        "aggregation": "algorithms.aggregation",
        "batch": "algorithms.batch",
        "callbacks": "evaluation.callbacks",
        "checkpoints": "trainer.checkpoints",
        "cispo": "presets.cispo",
        "dapo": "presets.dapo",
        "demo.arithmetic": "tasks.arithmetic",
        "demo.task": "tasks.digit_reversal",
        "demo.testbed": "tasks.chain_sums",
        "demo.tiny": "models.tiny",
        "demo.tiny_vlm": "models.tiny_vlm",
        "dppo": "presets.dppo",
        "dr_grpo": "presets.dr_grpo",
        "generator_process": "async_rollouts.process_generator",
        "guards": "trainer.guards",
        "importance_sampling": "algorithms.importance_sampling",
        "lm_head": "models.lm_head",
        "loading": "models.loading",
        "logits": "algorithms.logprobs",
        "losses": "algorithms.losses",
        "maxrl": "presets.maxrl",
        "model_card": "models.model_card",
        "pretrained": "models.pretrained",
        "prompt_lengths": "trainer.prompt_lengths",
        "rewards_math": "rewards.math_answers",
        "rloo": "presets.rloo",
        "rollout": "trainer.rollout",
        "sampler_logps": "async_rollouts.sampler_logps",
        "sampling": "algorithms.group_selection",
        "scalerl": "presets.scalerl",
        "scaling": "evaluation.compute_curves",
        "server_generator": "async_rollouts.server_generator",
        "shaping": "algorithms.shaping",
        "threads": "utils.threads",
        "topk_forward": "trainer.topk_forward",
        "trl_mirror": "algorithms.trl_mirror",
        "truncation": "algorithms.truncation",
        "typed_fields": "utils.typed_fields",
    }.items()
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module that now lives at its new path."""

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 (the finder protocol)
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:  # noqa: ANN001
        # The module keeps its own __name__ and __spec__ (importlib does not override them), so its classes keep
        # pickling under their new path.
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module was executed when it was imported."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
