"""The tasks of the command line's ``--task`` (``trl_reasoning.tasks.TASKS``): each task module registers its own."""

from __future__ import annotations

import pytest

from trl_reasoning.tasks import TASKS, CliTask, TaskRegistry
from trl_reasoning.tasks.arithmetic import ArithmeticTask
from trl_reasoning.tasks.digit_reversal import ReversalTask
from trl_reasoning.tasks.gsm8k import GSM8K


def test_each_task_module_registers_its_task():
    assert TASKS.names() == ("arithmetic", "gsm8k", "reverse", "tool_multiply")
    assert TASKS.get("reverse").build is ReversalTask and TASKS.get("reverse").warm_start
    assert TASKS.get("arithmetic").build is ArithmeticTask and not TASKS.get("arithmetic").warm_start
    assert TASKS.get("gsm8k").dataset == GSM8K == ("openai/gsm8k", "main") and TASKS.get("gsm8k").build is None
    assert [task.reward for task in TASKS] == [
        "last_number_reward",
        "math_answer_reward",
        "exact_match_reward",
        "trl_reasoning.tasks.tool_use.tool_answer_reward",
    ]


def test_the_gsm8k_row_format_is_format_gsm8k():
    row = TASKS.get("gsm8k").format_row({"question": "2 + 3?", "answer": "It is 5.\n#### 5"})
    assert row["answer"] == "5" and row["prompt"][-1] == {"role": "user", "content": "2 + 3?"}


def test_unknown_and_duplicate_names_are_refused():
    registry = TaskRegistry()
    registry.register(CliTask(name="b", help="bee", reward="r"))
    registry.register(CliTask(name="a", help="ay", reward="r"))
    with pytest.raises(ValueError, match=r"--eval_task: unknown task 'c'. Known tasks: a, b."):
        registry.get("c", "--eval_task")
    with pytest.raises(ValueError, match="task 'a' is already registered"):
        registry.register(CliTask(name="a", help="again", reward="r"))
    assert registry.help() == "'a' (ay) or 'b' (bee)" and registry.help(describe=False) == "'a' or 'b'"
    registry.unregister("a")
    assert registry.names() == ("b",) and registry.help() == "'b' (bee)" and "a" not in registry
