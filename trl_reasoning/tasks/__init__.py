"""Floor 2, verifiable tasks with their reward functions: one-step arithmetic (the real-model main job), digit
reversal (the tiny demo), digit-chain sums (the evidence testbed) and multiplication with a ``multiply`` tool (TRL's
tool loop). Reward functions here can be named in a YAML recipe by their dotted path, e.g.
``trl_reasoning.tasks.digit_reversal.digit_reward``.

The command line's ``--task`` choices are :data:`TASKS` (``tasks.registry``): each task module registers its own
(GSM8K's in ``tasks.gsm8k``) when imported here."""

from . import arithmetic, digit_reversal, gsm8k, tool_use  # noqa: F401  (each registers its --task)
from .registry import TASKS, CliTask, TaskRegistry

__all__ = ["TASKS", "CliTask", "TaskRegistry"]
