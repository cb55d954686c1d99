"""Floor 0, reward shaping: combined and task rewards, the binary check, the k1 sequence KL. Model-free."""

from __future__ import annotations

import math

import pytest
import torch

from trl_reasoning.rewards import RewardFunctionError
from trl_reasoning.shaping import check_binary_rewards, combined_rewards, sequence_kl

nan = math.nan


def test_combined_and_task_rewards():
    rewards_per_func = torch.tensor([[1.0, 0.5], [0.0, nan], [nan, nan], [nan, 1.0]])
    weights = torch.tensor([2.0, 1.0])
    combined = combined_rewards(rewards_per_func, weights)
    torch.testing.assert_close(combined, torch.tensor([2.5, 0.0, nan, 1.0]), equal_nan=True)
    # The task reward: only the first function; a completion it did not score is unscorable for the task.
    task = combined_rewards(rewards_per_func, weights, torch.tensor([True, False]))
    torch.testing.assert_close(task, torch.tensor([2.0, 0.0, nan, nan]), equal_nan=True)


def test_binary_check_names_the_function_then_the_weighted_sum():
    weights = torch.tensor([1.0, 1.0])
    with pytest.raises(RewardFunctionError, match=r"reward function 'graded' returned 0\.5"):
        check_binary_rewards(torch.tensor([[1.0, 0.5]]), torch.tensor([1.5]), ["correct", "graded"], weights, "maxrl")
    both_binary = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    with pytest.raises(RewardFunctionError, match=r"weighted sum of the reward functions \(correct, format"):
        check_binary_rewards(
            both_binary, combined_rewards(both_binary, weights), ["correct", "format"], weights, "maxrl"
        )
    check_binary_rewards(torch.tensor([[1.0], [nan]]), torch.tensor([1.0, nan]), ["correct"], weights[:1], "maxrl")


def test_sequence_kl_is_k1_summed_over_the_completion_without_gradient():
    old = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    kl = sequence_kl(old, ref, torch.tensor([[1.0, 1.0, 0.0]]))
    assert kl.tolist() == [0.5 - 1.0] and not kl.requires_grad
