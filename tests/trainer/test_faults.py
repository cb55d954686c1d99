"""Reward functions that raise (error naming the sample, or opt-in exclusion) and the non-finite loss guard."""

from __future__ import annotations

import pytest
from conftest import cpu_args

import trl_reasoning as tr
from trl_reasoning.rewards.wrapping import RewardFunctionError, wrap_reward_function


def fragile(prompts, completions, **kwargs) -> list[float]:
    """Fails on the prompt "3+1=" and scores the others by length."""
    out = []
    for prompt, completion in zip(prompts, completions):
        if prompt[-1]["content"] == "3+1=":
            raise ZeroDivisionError("no reward for 3+1=")
        out.append(len(completion[-1]["content"]) / 10)
    return out


def _batch(n=4):
    prompts = [[{"role": "user", "content": f"{i}+1="}] for i in range(n)]
    completions = [[{"role": "assistant", "content": "x" * i}] for i in range(n)]
    return prompts, completions


def test_a_raising_reward_names_the_function_and_the_sample():
    wrapped = wrap_reward_function(fragile, "fragile")
    prompts, completions = _batch()
    with pytest.raises(
        RewardFunctionError, match=r"'fragile' raised ZeroDivisionError on sample 3 \(prompt '3\+1='\)"
    ):
        wrapped(prompts=prompts, completions=completions)


def test_exclude_gives_none_to_the_failing_samples_and_counts_them():
    wrapped = wrap_reward_function(fragile, "fragile", on_error="exclude")
    prompts, completions = _batch(6)
    assert wrapped(prompts=prompts, completions=completions) == [0.0, 0.1, 0.2, None, 0.4, 0.5]
    assert wrapped.error_count == 1


def test_a_batch_level_failure_keeps_the_retried_values_when_excluding():
    calls = []

    def batch_only(prompts, completions, **kwargs):
        calls.append(len(completions))
        if len(completions) > 1:
            raise RuntimeError("needs a batch of one")
        return [1.0]

    wrapped = wrap_reward_function(batch_only, "batch_only", on_error="exclude")
    prompts, completions = _batch()
    assert wrapped(prompts=prompts, completions=completions) == [1.0] * len(completions)
    assert wrapped.error_count == 0 and wrapped.retried_count == len(completions)
    assert calls == [len(completions)] + [1] * len(completions)  # one batch call, then one call per sample


def test_a_batch_level_failure_is_raised_with_raise():
    def batch_only(prompts, completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("needs a batch of one")
        return [1.0]

    wrapped = wrap_reward_function(batch_only, "batch_only", on_error="raise")
    prompts, completions = _batch()
    with pytest.raises(RewardFunctionError, match=r"'batch_only' raised RuntimeError: needs a batch of one"):
        wrapped(prompts=prompts, completions=completions)


def test_raise_stops_calling_at_the_first_failing_sample():
    calls = []

    def fails_on_sample_1(prompts, completions, **kwargs):
        calls.append(list(completions))
        if len(completions) > 1 or completions[0] == completions_seen[1]:
            raise ValueError("cannot parse")
        return [0.0]

    prompts, completions = _batch()
    completions_seen = list(completions)
    wrapped = wrap_reward_function(fails_on_sample_1, "judge", on_error="raise")
    with pytest.raises(RewardFunctionError, match=r"'judge' raised ValueError on sample 1"):
        wrapped(prompts=prompts, completions=completions)
    assert len(calls) == 3  # the batch, sample 0, sample 1: no judge call for samples 2 and 3


def test_async_reward_functions_are_located_too():
    import asyncio

    async def fragile_async(prompts, completions, **kwargs):
        return fragile(prompts, completions)

    wrapped = wrap_reward_function(fragile_async, "fragile_async", on_error="exclude")
    prompts, completions = _batch()
    assert asyncio.run(wrapped(prompts=prompts, completions=completions)) == [0.0, 0.1, 0.2, None]


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="Unknown on_reward_error 'skip'. Allowed values: raise, exclude"):
        tr.DAPOConfig(**cpu_args(on_reward_error="skip"))


def test_the_non_finite_step_guard_without_a_model():
    """The guard alone (a run that skips a NaN step and one that exceeds the patience are rows of the reliability
    matrix, tests/test_reliability.py): a flagged step is skipped and logged, a finite one resets the count, patience is enforced."""
    from trl_reasoning.trainer.guards import NonFiniteLossError, NonFiniteLossWarning, NonFiniteStepGuard

    class Optimizer:
        taken = 0

        def step(self):
            Optimizer.taken += 1

    guard, skipped = NonFiniteStepGuard(patience=1), []
    optimizer = guard.install(Optimizer(), step_number=lambda: 7, on_skip=skipped.append)
    assert guard.install(optimizer, step_number=lambda: 7) is optimizer  # installed once
    guard.record(False)
    optimizer.step()
    guard.record(True)
    guard.record(False)  # a later finite micro-batch of the same step does not clear the flag
    with pytest.warns(NonFiniteLossWarning, match="Skipped optimizer step 7"):
        optimizer.step()
    optimizer.step()  # finite: taken, the run of skips resets
    for _ in range(2):
        guard.record(True)
        if guard.consecutive == 1:
            with pytest.raises(NonFiniteLossError, match=r"2 consecutive optimizer steps.*step 7"):
                optimizer.step()
        else:
            with pytest.warns(NonFiniteLossWarning):
                optimizer.step()
    assert (Optimizer.taken, skipped, guard.skipped) == (2, [1, 2, 3], 3)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/python", "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "train.py"], 2),
        (["/venv/bin/accelerate", "launch", "--num_processes=4", "-m", "trl_reasoning.cli", "dapo"], 4),
        (["/venv/bin/python", "/venv/bin/accelerate", "launch", "train.py"], None),
        (["/venv/bin/python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], None),
        (["bash", "run.sh", "--num_processes", "2"], None),
    ],
)
def test_the_launcher_command_line_is_read_for_the_process_count(argv, expected):
    from trl_reasoning.trainer.guards import requested_processes

    assert requested_processes(argv) == expected


def test_accelerate_launch_cpu_with_two_processes_is_reported(tmp_path):
    """`accelerate launch --cpu --num_processes 2` runs one process without a word; the run says so."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from trl_reasoning.trainer.guards import warn_if_launcher_lost_processes\n"
        "warn_if_launcher_lost_processes(dist.get_world_size() if dist.is_initialized() else 1)\n"
    )
    accelerate = Path(sys.executable).with_name("accelerate")
    result = subprocess.run(
        [str(accelerate), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "LaunchWarning: `accelerate launch` asked for 2 processes, but this run has 1" in result.stderr
