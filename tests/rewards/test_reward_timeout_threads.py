"""`reward_timeout` keeps threads bounded: a sync reward whose timed-out call is still running is not called again
(its samples excluded and counted, one warning naming it), and is used again once that call returns."""

from __future__ import annotations

import logging
import math
import threading

import pytest
import torch
from conftest import cpu_args, digit_fraction, logged_metric, make_prompts
from transformers import TrainerCallback

import trl_reasoning as tr
from trl_reasoning.rewards.wrapping import RewardTimeoutError, check_reward_columns, wrap_reward_function


class _ThreadCount(TrainerCallback):
    """The number of live threads at the end of every optimizer step."""

    def __init__(self):
        self.counts: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.counts.append(threading.active_count())


@pytest.fixture
def released():
    """An event the hanging rewards wait on; set after the test so that their threads end."""
    event = threading.Event()
    yield event
    event.set()
    for thread in threading.enumerate():
        if thread.name.startswith("reward-"):
            thread.join(10)


def test_a_reward_that_always_hangs_leaves_one_thread_and_its_samples_are_counted(
    tiny_model_path, tmp_path, released, caplog
):
    calls = []

    def hung_judge(completions, **kwargs):
        calls.append(len(completions))
        released.wait()  # never returns while the test runs
        return [1.0] * len(completions)

    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), max_steps=6, reward_timeout=0.2, on_reward_error="exclude")
    )
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path, reward_funcs=[digit_fraction, hung_judge], args=args, train_dataset=make_prompts()
    )
    threads = _ThreadCount()
    trainer.add_callback(threads)
    before = threading.active_count()
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        trainer.train()

    assert trainer.state.global_step == 6
    # each step's warning says what happened to the judge: it timed out once, then was skipped (never "returned None")
    reported = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Reward function 'hung_judge' ")]
    assert not [m for m in reported if "returned None or NaN" in m]
    assert [m for m in reported if "did not return within reward_timeout=0.2 s: none of the 8" in m] != []
    skipped = [
        m for m in reported if "was skipped because its previous call is still running past reward_timeout" in m
    ]
    assert len(skipped) == 5 and all("counted in rewards/hung_judge/errors" in m for m in skipped)
    assert calls == [8]  # called once: every later call waits for that one to return
    assert max(threads.counts) <= before + 1  # one stuck thread, not one a step
    assert threads.counts == [threads.counts[0]] * 6
    assert logged_metric(trainer, "rewards/hung_judge/errors") == [8.0] * 6
    assert all(math.isfinite(loss) for loss in logged_metric(trainer, "loss"))


def _batch(n: int = 4) -> dict:
    return {
        "prompts": [[{"role": "user", "content": f"{i}+1="}] for i in range(n)],
        "completions": [[{"role": "assistant", "content": str(i)}] for i in range(n)],
    }


def test_a_reward_that_hangs_once_is_skipped_until_that_call_returns_then_called_again(released, caplog):
    calls = []

    def hangs_once(completions, **kwargs):
        calls.append(len(completions))
        if len(calls) == 1:
            released.wait()
        return [0.5] * len(completions)

    wrapped = wrap_reward_function(hangs_once, "hangs_once", on_error="exclude", timeout=0.2)
    before = threading.active_count()
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        assert wrapped(**_batch()) == [None] * 4  # timed out
        assert wrapped(**_batch()) == [None] * 4  # not called: the first call is still running
        assert wrapped(**_batch()) == [None] * 4
    assert calls == [4] and wrapped.error_count == 12
    assert threading.active_count() == before + 1
    warnings = [r.getMessage() for r in caplog.records if "is not called while" in r.getMessage()]
    assert len(warnings) == 1 and "'hangs_once'" in warnings[0]

    released.set()  # the stuck call returns
    stuck = [t for t in threading.enumerate() if t.name == "reward-hangs_once"]
    for thread in stuck:
        thread.join(5)
    assert wrapped(**_batch()) == [0.5] * 4  # called again
    assert calls == [4, 4] and wrapped.error_count == 12
    assert threading.active_count() == before


def test_a_call_that_timed_out_or_was_skipped_is_reported_as_such_not_as_none(released, caplog):
    """``check_reward_columns`` (the trainer calls it after each batch's rewards) says why the column is empty."""

    def hangs_once(completions, **kwargs):
        if not released.is_set():
            released.wait()
        return [None] * len(completions)  # once it answers: a verifier that scores nothing, legitimately

    wrapped = wrap_reward_function(hangs_once, "hangs_once", on_error="exclude", timeout=0.2)
    empty = torch.full((4, 1), math.nan)

    def reported() -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
            check_reward_columns(empty, ["hangs_once"])
        (message,) = [r.getMessage() for r in caplog.records]
        return message

    assert wrapped(**_batch()) == [None] * 4
    assert reported().startswith("Reward function 'hangs_once' did not return within reward_timeout=0.2 s: none of")
    assert wrapped(**_batch()) == [None] * 4
    message = reported()
    assert message.startswith(
        "Reward function 'hangs_once' was skipped because its previous call is still running past reward_timeout=0.2 s"
    )
    assert "none of the 4 completions of the batch got its reward (counted in rewards/hangs_once/errors)" in message
    released.set()
    for thread in [t for t in threading.enumerate() if t.name == "reward-hangs_once"]:
        thread.join(5)
    assert wrapped(**_batch()) == [None] * 4  # called: its own None this time
    assert reported().startswith("Reward function 'hangs_once' returned None or NaN for all 4 completions")


def test_with_raise_a_call_while_the_previous_one_is_stuck_is_the_timeout_error_naming_it(released):
    def hung(completions, **kwargs):
        released.wait()
        return [1.0] * len(completions)

    wrapped = wrap_reward_function(hung, "hung", on_error="raise", timeout=0.2)
    before = threading.active_count()
    with pytest.raises(RewardTimeoutError, match=r"'hung' did not return within reward_timeout=0.2 s"):
        wrapped(**_batch())
    for _ in range(2):  # not called again: the error says so
        with pytest.raises(
            RewardTimeoutError,
            match=r"'hung' was skipped because its previous call is still running past reward_timeout=0.2 s",
        ):
            wrapped(**_batch())
    assert threading.active_count() == before + 1


def test_sample_by_sample_retries_stop_calling_a_function_whose_retry_hangs(released):
    """A batch that raises is retried sample by sample: a retry that hangs must not start one thread per sample."""
    calls = []

    def fails_then_hangs(completions, **kwargs):
        calls.append(len(completions))
        if len(completions) > 1:
            raise RuntimeError("batch failed")
        released.wait()
        return [1.0]

    wrapped = wrap_reward_function(fails_then_hangs, "fails_then_hangs", on_error="exclude", timeout=0.2)
    before = threading.active_count()
    assert wrapped(**_batch()) == [None] * 4
    assert calls == [4, 1] and wrapped.error_count == 4
    assert threading.active_count() == before + 1
