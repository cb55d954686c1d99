"""Floor 0, reward shaping: combined and task rewards, the binary check, the k1 sequence KL. Model-free."""

from __future__ import annotations

import math

import pytest
import torch

from trl_reasoning.algorithms.shaping import check_binary_rewards, combined_rewards, sequence_kl
from trl_reasoning.rewards.wrapping import RewardFunctionError

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


# ---------------------------------------------------------------------------------------- normalize_then_sum, clipping


def test_normalize_then_sum_standardises_each_function_within_its_group_then_sums():
    from trl_reasoning.algorithms.shaping import normalize_then_sum_rewards

    # Two functions, G = 2, weights (1, 2). Group 1: f1 = (0, 1) -> z = (-1, 1) / (std + eps) with std = 1/sqrt(2);
    # f2 = (10, 10) -> z = 0. Group 2: f1 = (NaN, 3) -> one scored value: std NaN, z NaN (adds nothing);
    # f2 = (4, 0) -> std = 2 sqrt(2), z = (2, -2) / (2 sqrt(2) + eps).
    eps = 1e-4
    per_func = torch.tensor([[0.0, 10.0], [1.0, 10.0], [float("nan"), 4.0], [3.0, 0.0]], dtype=torch.float64)
    out = normalize_then_sum_rewards(per_func, torch.tensor([1.0, 2.0]), num_generations=2)
    s1, s2 = 1 / math.sqrt(2), 2 * math.sqrt(2)
    expected = [-0.5 / (s1 + eps), 0.5 / (s1 + eps), 2 * 2 / (s2 + eps), 2 * -2 / (s2 + eps)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # a completion no function scored stays unscorable
    per_func[0] = float("nan")
    assert math.isnan(normalize_then_sum_rewards(per_func, torch.tensor([1.0, 2.0]), 2)[0].item())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_normalize_then_sum_matches_a_reference_on_random_rewards(seed):
    from trl_reasoning.algorithms.shaping import normalize_then_sum_rewards

    gen = torch.Generator().manual_seed(seed)
    groups, size, funcs = 4, 3, 3
    per_func = torch.randn(groups * size, funcs, dtype=torch.float64, generator=gen)
    per_func[torch.rand(per_func.shape, generator=gen) < 0.2] = float("nan")
    weights = torch.rand(funcs, generator=gen)
    out = normalize_then_sum_rewards(per_func, weights, size).tolist()
    values = per_func.tolist()
    for i in range(groups * size):
        start = i // size * size
        total, any_scored = 0.0, False
        for k in range(funcs):
            column = [values[j][k] for j in range(start, start + size) if not math.isnan(values[j][k])]
            r = values[i][k]
            if math.isnan(r):
                continue
            any_scored = True
            if len(column) < 2:
                continue  # std undefined: this function adds nothing for the group
            mean = sum(column) / len(column)
            std = math.sqrt(sum((c - mean) ** 2 for c in column) / (len(column) - 1))
            total += weights[k].item() * (r - mean) / (std + 1e-4)
        if any_scored:
            assert out[i] == pytest.approx(total, rel=1e-12, abs=1e-12)
        else:
            assert math.isnan(out[i])


def test_clip_rewards_clamps_and_keeps_nan():
    from trl_reasoning.algorithms.shaping import clip_rewards

    rewards = torch.tensor([-3.0, 0.5, 7.0, float("nan")])
    out = clip_rewards(rewards, (-1.0, 2.0))
    assert out[:3].tolist() == [-1.0, 0.5, 2.0] and math.isnan(out[3].item())
    assert clip_rewards(rewards, None) is rewards
