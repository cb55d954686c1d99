"""GSM8K (``openai/gsm8k``, config ``main``) on the command line: ``--task gsm8k`` loads it (or formats the
``--dataset_name`` given beside it) as conversational prompts with the reference number in ``answer``
(``rewards.math_answers.format_gsm8k``), rewarded by ``math_answer_reward``."""

from __future__ import annotations

from typing import Any

from .registry import TASKS, CliTask

#: The Hub dataset and configuration of ``--task gsm8k`` without ``--dataset_name``.
GSM8K = ("openai/gsm8k", "main")


def format_row(example: dict[str, Any]) -> dict[str, Any]:
    """``rewards.math_answers.format_gsm8k`` (imported on use: it imports torch, and ``trl_reasoning.tasks`` does
    not)."""
    from ..rewards.math_answers import format_gsm8k

    return format_gsm8k(example)


TASKS.register(
    CliTask(name="gsm8k", help="math answers", reward="math_answer_reward", dataset=GSM8K, format_row=format_row)
)
