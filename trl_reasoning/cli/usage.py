"""The text of ``trl-reasoning --help``, printed without importing a preset, TRL or torch.

Listing the algorithm subcommands from ``TRAINERS`` imports every preset, and with them TRL, transformers and torch:
about 8 s on a 2-core machine for a 12-line list (``trl --help`` answers in 0.2 s). The list is written here instead,
as names, and ``tests/cli/test_usage.py`` fails when it differs from ``TRAINERS`` (a preset added or renamed).
"""

from __future__ import annotations

from ..models.pretrained import SMOLLM2_NAME

#: ``(subcommand, trainer class name, config class name)`` of every algorithm subcommand, in ``TRAINERS``' order.
ALGORITHM_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("dapo", "DAPOTrainer", "DAPOConfig"),
    ("cispo", "CISPOTrainer", "CISPOConfig"),
    ("gspo", "GSPOTrainer", "GSPOConfig"),
    ("prorl", "ProRLTrainer", "ProRLConfig"),
    ("dppo", "DPPOTrainer", "DPPOConfig"),
    ("maxrl", "MaxRLTrainer", "MaxRLConfig"),
    ("rloo", "RLOOTrainer", "RLOOConfig"),
    ("reinforce_pp", "ReinforcePPTrainer", "ReinforcePPConfig"),
    ("dr_grpo", "DrGRPOTrainer", "DrGRPOConfig"),
    ("scalerl", "ScaleRLTrainer", "ScaleRLConfig"),
    ("reasoning", "ReasoningTrainer", "ReasoningConfig"),
)


def asks_for_usage(argv: list[str]) -> bool:
    """Whether ``argv`` (the arguments after the program name) asks for the top-level usage."""
    return not argv or argv[0] in ("-h", "--help", "help")


def usage() -> str:
    """``trl-reasoning --help``: the commands, one line each."""
    lines = [
        "usage: trl-reasoning <command> [--config recipe.yaml] [--field value ...]",
        "",
        "commands:",
        *[f"  {name:<10} train with {trainer} ({config})" for name, trainer, config in ALGORITHM_COMMANDS],
        "  train      --preset NAME: the same as the preset's command (a recipe serves every preset)",
        "  demo       the offline demo: warm start, RL, before/after table, curves, model card",
        "  eval       pass@k of a saved model on a dataset with a reward function",
        "  recipes    list the shipped recipes (YAML); --copy DIR copies them",
        f"  model      convert the offline pretrained model ({SMOLLM2_NAME}) into the cache and print its path",
        "",
        "`trl-reasoning <command> --help` lists every field with its default.",
    ]
    return "\n".join(lines)
