"""Reward shaping and reward-function wrapping (trl_reasoning/rewards/wrapping.py).

Overlong shaping follows docs/algorithms.md ("Reward shaping", DAPO Eq. 13).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.rewards.wrapping import (
    RewardFunctionError,
    binarize_rewards,
    check_reward_columns,
    non_binary_reward_functions,
    overlong_penalty,
    wrap_reward_function,
)

NAN = float("nan")


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------------
# overlong_penalty
# ---------------------------------------------------------------------------------------------------------------------


def test_overlong_penalty_boundaries():
    # L_max = 20, L_c = 4, L_max - L_c = 16.
    # |y| = 0, 16 -> 0; 17 -> (16 - 17) / 4 = -0.25; 18 -> -0.5; 20 -> (16 - 20) / 4 = -1; 21, 100 -> -1 (beyond).
    lengths = torch.tensor([0, 16, 17, 18, 20, 21, 100])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    assert_close(overlong_penalty(lengths, 20, 4), expected, rtol=0, atol=0)


def test_overlong_penalty_cache_as_long_as_the_max_length():
    # L_max = L_c = 4: the ramp starts at 0 tokens. |y| = 0 -> 0, 1 -> -0.25, 3 -> -0.75, 4 -> -1, 5 -> -1.
    assert_close(overlong_penalty(torch.tensor([0, 1, 3, 4, 5]), 4, 4), torch.tensor([0.0, -0.25, -0.75, -1.0, -1.0]))


def test_overlong_penalty_matches_the_formula_for_every_length():
    max_len, cache = 12, 5
    lengths = torch.arange(0, 20)
    expected = [
        0.0 if y <= max_len - cache else -1.0 if y > max_len else ((max_len - cache) - y) / cache for y in range(20)
    ]
    assert_close(overlong_penalty(lengths, max_len, cache), torch.tensor(expected), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cache", [0, -1, 21])
def test_overlong_penalty_rejects_a_cache_outside_the_max_length(cache):
    with pytest.raises(ValueError, match="overlong_cache_length"):
        overlong_penalty(torch.tensor([1]), 20, cache)


# ---------------------------------------------------------------------------------------------------------------------
# binarize_rewards / non_binary_reward_functions
# ---------------------------------------------------------------------------------------------------------------------


def test_binarize_rewards_keeps_nan():
    # >= threshold counts as a success; NaN (unscorable) stays NaN.
    out = binarize_rewards(t64([0.2, 0.5, NAN, 0.9, -3.0]), 0.5)
    assert_close(out, t64([0, 1, NAN, 1, 0]), equal_nan=True, rtol=0, atol=0)


def test_non_binary_reward_functions_names_offenders_with_a_value():
    # column "acc" is 0/1 (NaN ignored); "fmt" has 0.5 and 2.
    rewards = t64([[1, 0.5], [0, NAN], [NAN, 2], [1, 1]])
    assert non_binary_reward_functions(rewards, ["acc", "fmt"]) == [("fmt", 0.5)]
    assert non_binary_reward_functions(t64([[1, 0], [0, NAN]]), ["a", "b"]) == []


# ---------------------------------------------------------------------------------------------------------------------
# check_reward_columns
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_check_reward_columns_raises_for_inf(bad):
    rewards = t64([[1, 0], [0, bad], [1, 1]])
    with pytest.raises(RewardFunctionError, match="'length_reward'.*completion 1") as info:
        check_reward_columns(rewards, ["acc", "length_reward"])
    assert "finite" in str(info.value)


def test_check_reward_columns_only_warns_for_a_single_all_nan_function(caplog):
    # TRL trains on (advantage 0 for unscorable completions): a verifier may parse no answer of an early batch.
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        check_reward_columns(t64([[NAN], [NAN], [NAN]]), ["acc"])
    assert "'acc' returned None or NaN for all 3 completions" in caplog.text
    assert "trains nothing" in caplog.text


def test_check_reward_columns_only_warns_when_every_function_is_all_nan(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        check_reward_columns(t64([[NAN, NAN], [NAN, NAN]]), ["a", "b"])
    assert "No reward function (a, b) scored any completion of the batch" in caplog.text


def test_check_reward_columns_only_warns_for_one_all_nan_function_among_several(caplog):
    # Multi-task routing: a function may return None for a whole batch while another scores it.
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        check_reward_columns(t64([[1, NAN], [0, NAN], [NAN, NAN]]), ["math", "code"])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'code'" in warnings[0].getMessage()


def test_check_reward_columns_accepts_partly_nan_columns_silently(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        check_reward_columns(t64([[1, NAN], [NAN, 0.5], [0, 0]]), ["a", "b"])
    assert not caplog.records


# ---------------------------------------------------------------------------------------------------------------------
# wrap_reward_function
# ---------------------------------------------------------------------------------------------------------------------


def accuracy_reward(completions, **kwargs):
    return [1.0 if "42" in c else 0.0 for c in completions]


async def async_accuracy_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return [1.0 if "42" in c else None for c in completions]


def broken_reward(completions, **kwargs):
    raise KeyError("answer")


async def async_broken_reward(completions, **kwargs):
    await asyncio.sleep(0)
    raise ZeroDivisionError("division by zero")


class AsyncCallableReward:
    async def __call__(self, completions, **kwargs):
        return [0.5] * len(completions)


def test_wrapped_sync_function_keeps_name_and_result():
    wrapped = wrap_reward_function(accuracy_reward, accuracy_reward.__name__)
    assert wrapped.__name__ == "accuracy_reward"
    assert not inspect.iscoroutinefunction(wrapped)
    assert wrapped(prompts=["p", "p"], completions=["42", "41"]) == [1.0, 0.0]
    assert wrapped.__wrapped_reward_function__ is accuracy_reward


def test_wrapped_async_function_stays_a_coroutine_function():
    wrapped = wrap_reward_function(async_accuracy_reward, "async_accuracy_reward")
    assert wrapped.__name__ == "async_accuracy_reward"
    assert inspect.iscoroutinefunction(wrapped)  # TRL runs coroutine reward functions concurrently
    assert asyncio.run(wrapped(completions=["42", "x"])) == [1.0, None]


def test_wrapped_async_callable_object_is_a_coroutine_function():
    wrapped = wrap_reward_function(AsyncCallableReward(), "judge")
    assert wrapped.__name__ == "judge"
    assert inspect.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped(completions=["a", "b"])) == [0.5, 0.5]


def test_sync_exception_names_the_function():
    wrapped = wrap_reward_function(broken_reward, "broken_reward")
    with pytest.raises(RewardFunctionError, match="'broken_reward' raised KeyError") as info:
        wrapped(completions=["a"])
    assert isinstance(info.value.__cause__, KeyError)  # the original traceback is kept


def test_async_exception_names_the_function():
    wrapped = wrap_reward_function(async_broken_reward, "async_broken_reward")
    with pytest.raises(RewardFunctionError, match="'async_broken_reward' raised ZeroDivisionError") as info:
        asyncio.run(wrapped(completions=["a"]))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_reward_function_error_is_not_wrapped_twice():
    def raises_own(completions, **kwargs):
        raise RewardFunctionError("already named")

    with pytest.raises(RewardFunctionError, match="^already named$"):
        wrap_reward_function(raises_own, "outer")(completions=["a"])


@pytest.mark.parametrize("is_async", [False, True])
def test_wrong_number_of_rewards_names_the_function(is_async):
    def short(completions, **kwargs):
        return [1.0]

    async def async_short(completions, **kwargs):
        return [1.0]

    wrapped = wrap_reward_function(async_short if is_async else short, "short_reward")
    with pytest.raises(RewardFunctionError, match="'short_reward' returned 1 rewards for 3 completions"):
        result = wrapped(completions=["a", "b", "c"])
        if is_async:
            asyncio.run(result)


def test_wrong_number_of_rewards_raises_when_called_sync():
    wrapped = wrap_reward_function(lambda completions, **kw: [1.0, 0.0, 1.0], "too_many")
    with pytest.raises(RewardFunctionError, match="'too_many' returned 3 rewards for 2 completions"):
        wrapped(completions=["a", "b"])


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (["good", 1.0], r"'judge' returned 'good' \(str\) for completion 0"),
        ([1.0, [0.5]], r"'judge' returned \[0.5\] \(list\) for completion 1"),
        (None, "'judge' returned NoneType"),
        ("1.0", "'judge' returned str"),
        (1.0, "'judge' returned float"),
        # shapes TRL cannot take as one reward per completion (it takes 1-D and (n, 1) tensors, 1-D arrays)
        (torch.ones(2, 2), r"'judge' returned a tensor of shape \(2, 2\); it must return one reward per completion"),
        (torch.ones(1, 2), r"'judge' returned a tensor of shape \(1, 2\)"),
        (torch.tensor(1.0), r"'judge' returned a tensor of shape \(\)"),
        (np.ones((2, 1)), r"'judge' returned an array \(ndarray\) of shape \(2, 1\).*reshape\(-1\)"),
    ],
)
def test_non_numeric_outputs_name_the_function(output, message):
    wrapped = wrap_reward_function(lambda completions, **kw: output, "judge")
    with pytest.raises(RewardFunctionError, match=message):
        wrapped(completions=["a", "b"])


def test_async_non_numeric_output_names_the_function():
    async def judge(completions, **kwargs):
        return ["yes"] * len(completions)

    with pytest.raises(RewardFunctionError, match="'judge' returned 'yes'"):
        asyncio.run(wrap_reward_function(judge, "judge")(completions=["a"]))


def test_none_ints_bools_and_tensors_are_valid_rewards():
    outputs = [[None, 1], [True, 0.5], torch.tensor([0.25, 1.0])]
    for output in outputs:
        assert wrap_reward_function(lambda completions, o=output, **kw: o, "f")(completions=["a", "b"]) is output


@pytest.mark.parametrize(
    "output", [np.array([0.5, 1.0], dtype=np.float32), [np.int64(1), np.int64(0)], [np.float32(0.5), None]]
)
def test_numpy_rewards_are_accepted_like_trl_does(output):
    torch.tensor([np.nan if r is None else r for r in output], dtype=torch.float32)  # TRL accepts these values
    wrapped = wrap_reward_function(lambda completions, **kw: output, "numpy_reward")
    assert wrapped(completions=["a", "b"]) is output


def test_length_is_not_checked_without_completions_kwarg():
    # Without `completions` the wrapper cannot know the expected count (it only checks types).
    assert wrap_reward_function(lambda *a, **kw: [1.0], "f")(["a", "b"]) == [1.0]
