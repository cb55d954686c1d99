"""Advantage estimators (trl_reasoning/algorithms/advantages.py) against docs/algorithms.md ("Advantage estimators").

Hand-computed small cases first, then an independent float64 reference written with plain Python loops.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.algorithms.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, nan_std

NAN = float("nan")
EPS = 1e-4
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "maxrl", "batch", "scalerl", "batch_zscore")
#: One advantage per completion token (REINFORCE++'s); tested in test_reinforce_pp.py.
TOKEN_LEVEL_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def check(actual, expected):
    assert actual.dtype == torch.float64
    assert_close(actual, t64(expected), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------------------------------


def test_grpo_two_groups_of_two():
    # Groups [1, 0] and [0, 1]: mean 0.5, Bessel std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) = 0.70710678.
    # A = +-0.5 / (0.70710678 + 1e-4) = +-0.70700680
    a = 0.7070067953266834
    check(compute_advantages(t64([1, 0, 0, 1]), 2, "grpo"), [a, -a, -a, a])


def test_grpo_all_equal_group_gets_zero_not_nan():
    # Group [0.75] * 3 has std 0: (r - mean) / (0 + eps) = 0 / 1e-4 = 0. Group [2, 0, 1]: mean 1, std 1.
    # A = [1, -1, 0] / (1 + 1e-4)
    a = 1 / (1 + EPS)
    check(compute_advantages(t64([0.75, 0.75, 0.75, 2, 0, 1]), 3, "grpo"), [0, 0, 0, a, -a, 0])


def test_grpo_nan_reward_is_excluded_from_group_stats_and_gets_zero():
    # Scorable [1, 0, 1]: mean 2/3, deviations (1/3, -2/3, 1/3), squares sum 6/9, / (3 - 1) = 1/3, std = 0.57735027.
    # A = (1/3) / (0.57735027 + 1e-4) = 0.57725029 and (-2/3) / (...) = -1.15450057; the NaN completion gets 0.
    check(
        compute_advantages(t64([1, 0, NAN, 1]), 4, "grpo"),
        [0.5772502865071344, -1.1545005730142688, 0, 0.5772502865071344],
    )


def test_grpo_group_with_one_or_no_scorable_completion_is_zero():
    # [NaN, 2]: one scorable value, no spread, centred reward 0. [NaN, NaN]: no statistics at all.
    check(compute_advantages(t64([NAN, 2, NAN, NAN]), 2, "grpo"), [0, 0, 0, 0])


def test_grpo_epsilon_is_configurable():
    # [3, 1]: mean 2, std sqrt(2); A = +-1 / (sqrt(2) + 0.5)
    a = 1 / (math.sqrt(2) + 0.5)
    check(compute_advantages(t64([3, 1]), 2, "grpo", epsilon=0.5), [a, -a])


def test_dr_grpo_subtracts_the_group_mean_only():
    # [1, 0, 0, 0]: mean 0.25 -> [0.75, -0.25, -0.25, -0.25]. [2, NaN, 0]: scorable mean 1 -> [1, 0, -1].
    check(compute_advantages(t64([1, 0, 0, 0]), 4, "dr_grpo"), [0.75, -0.25, -0.25, -0.25])
    check(compute_advantages(t64([2, NAN, 0]), 3, "dr_grpo"), [1, 0, -1])


def test_rloo_leave_one_out_baseline():
    # [1, 0, 0, 0]: A_0 = 1 - (0 + 0 + 0) / 3 = 1; A_1 = 0 - (1 + 0 + 0) / 3 = -1/3 (= 4/3 * (r - 0.25)).
    check(compute_advantages(t64([1, 0, 0, 0]), 4, "rloo"), [1, -1 / 3, -1 / 3, -1 / 3])


def test_rloo_with_one_scorable_sibling_uses_it_as_baseline():
    # [1, 0, NaN]: the baseline averages the scorable siblings only: A_0 = 1 - 0 = 1, A_1 = 0 - 1 = -1, NaN -> 0.
    check(compute_advantages(t64([1, 0, NAN]), 3, "rloo"), [1, -1, 0])


def test_rloo_without_a_scorable_sibling_is_zero():
    # [1, NaN]: no sibling to form a baseline -> 0 (not NaN, not inf).
    check(compute_advantages(t64([1, NAN, 0.5, 0.25]), 2, "rloo"), [0, 0, 0.25, -0.25])


def test_maxrl_divides_by_the_success_rate():
    # [1, 0, 0, 0]: p = 0.25 -> A = (1 - 0.25) / 0.25 = 3 and (0 - 0.25) / 0.25 = -1.
    # [1, 1, 1, 1]: p = 1 -> all 0.
    check(compute_advantages(t64([1, 0, 0, 0, 1, 1, 1, 1]), 4, "maxrl"), [3, -1, -1, -1, 0, 0, 0, 0])


def test_maxrl_group_with_success_rate_zero_is_all_zero():
    # p = 0 would divide by 0: the whole group gets 0.
    check(compute_advantages(t64([0, 0, 0, 1, 0, 1]), 3, "maxrl"), [0, 0, 0, 0.5, -1, 0.5])


def test_maxrl_nan_is_excluded_from_the_success_rate():
    # [1, NaN, 0, 0]: p = 1/3 -> A = (2/3) / (1/3) = 2, (-1/3) / (1/3) = -1; NaN -> 0.
    check(compute_advantages(t64([1, NAN, 0, 0]), 4, "maxrl"), [2, 0, -1, -1])


def test_maxrl_rejects_non_binary_rewards():
    with pytest.raises(ValueError, match="binary"):
        compute_advantages(t64([0.5, 1, 0, 0]), 2, "maxrl")


def test_maxrl_threshold_binarizes():
    # threshold 0.5: [0.7, 0.2, 0.5, 0.1] -> [1, 0, 1, 0] (>= counts), p = 0.5 -> A = [1, -1, 1, -1].
    check(compute_advantages(t64([0.7, 0.2, 0.5, 0.1]), 4, "maxrl", reward_threshold=0.5), [1, -1, 1, -1])
    # threshold 0: [3, NaN, -2, 0.25] -> [1, NaN, 0, 1], p = 2/3 -> A = (1/3) / (2/3) = 0.5, (-2/3) / (2/3) = -1.
    check(compute_advantages(t64([3.0, NAN, -2.0, 0.25]), 4, "maxrl", reward_threshold=0.0), [0.5, 0, -1, 0.5])


def test_batch_zscore_centres_and_scales_on_the_whole_batch():
    # rewards [1, 3 | 2, 6]: batch mean 3, Bessel std sqrt((4 + 0 + 1 + 9) / 3) = sqrt(14/3). No group baseline.
    std = math.sqrt(14 / 3)
    check(compute_advantages(t64([1, 3, 2, 6]), 2, "batch_zscore"), [(r - 3) / (std + EPS) for r in (1, 3, 2, 6)])
    # NaN is left out of both statistics and gets 0: [1, NaN | 2, 6] -> mean 3, std sqrt((4 + 1 + 9) / 2)
    std = math.sqrt(7)
    check(
        compute_advantages(t64([1, NAN, 2, 6]), 2, "batch_zscore"),
        [-2 / (std + EPS), 0, -1 / (std + EPS), 3 / (std + EPS)],
    )


def test_normalize_standardises_the_estimators_advantages_over_the_batch():
    # TRL RLOOConfig.normalize_advantages: rloo advantages of [0, 1 | 1, 1] are [-1, 1, 0, 0] (G/(G-1) * centred);
    # mean 0, std sqrt(2/3).
    std = math.sqrt(2 / 3)
    expected = [-1 / (std + EPS), 1 / (std + EPS), 0.0, 0.0]
    check(compute_advantages(t64([0, 1, 1, 1]), 2, "rloo", normalize=True), expected)
    # Unscorable rows stay out of the statistics and end at 0: rloo of [0, 1 | NaN, 1] is [-1, 1, NaN, NaN] (the
    # last has no scorable sibling); over [-1, 1]: mean 0, std sqrt(2).
    std = math.sqrt(2)
    check(
        compute_advantages(t64([0, 1, NAN, 1]), 2, "rloo", normalize=True), [-1 / (std + EPS), 1 / (std + EPS), 0, 0]
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "dr_grpo"])
def test_normalize_matches_reference_on_random_rewards(estimator, seed):
    rewards, num_generations = random_rewards(seed, binary=False)
    raw = reference_advantages(rewards.tolist(), num_generations, estimator)
    # the reference's unscorable rows (NaN reward, or rloo without a scorable sibling) are 0 there; leave them out
    values = rewards.tolist()
    grouped = [values[i : i + num_generations] for i in range(0, len(values), num_generations)]
    scorable = []
    for group in grouped:
        count = sum(not math.isnan(r) for r in group)
        scorable += [not math.isnan(r) and (estimator != "rloo" or count >= 2) for r in group]
    kept = [a for a, ok in zip(raw, scorable) if ok]
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((a - mean) ** 2 for a in kept) / (len(kept) - 1))
    expected = [(a - mean) / (std + EPS) if ok else 0.0 for a, ok in zip(raw, scorable)]
    check(compute_advantages(rewards, num_generations, estimator, normalize=True), expected)


def test_batch_normalizes_by_the_std_of_the_whole_batch():
    # Scorable rewards {1, 0, 1, 0, 0}: mean 0.4, squares 0.36 + 0.16 + 0.36 + 0.16 + 0.16 = 1.2, / 4 = 0.3,
    # sigma_batch = sqrt(0.3) = 0.54772256. Group [1, NaN, 0]: mean 0.5 -> +-0.5 / (0.54772256 + 1e-4) = +-0.91270429.
    # Group [1, 0, 0]: mean 1/3 -> (2/3) / (...) = 1.21693906, (-1/3) / (...) = -0.60846953.
    a, b, c = 0.9127042929320867, 1.2169390572427823, -0.6084695286213911
    check(compute_advantages(t64([1, NAN, 0, 1, 0, 0]), 3, "batch"), [a, 0, -a, b, c, c])


def test_scalerl_scales_by_the_std_of_the_centred_advantages():
    # Groups [1, 0] and [1, 1] (means 0.5 and 1): centred [0.5, -0.5, 0, 0], whose std is sqrt(1/6) = 0.40824829;
    # the raw rewards' std would be 0.5 (the `batch` estimator).
    a = 0.5 / (math.sqrt(1 / 6) + 1e-4)
    check(compute_advantages(t64([1, 0, 1, 1]), 2, "scalerl"), [a, -a, 0, 0])
    b = 0.5 / (0.5 + 1e-4)
    check(compute_advantages(t64([1, 0, 1, 1]), 2, "batch"), [b, -b, 0, 0])


def test_scalerl_on_pm1_rewards_is_larger_than_batch():
    # docs/algorithms.md: on +-1 rewards the raw-reward std also counts the spread between prompts.
    rewards, num_generations = random_rewards(4, binary=True)
    rewards = torch.nan_to_num(rewards, nan=0.0) * 2 - 1
    scalerl = compute_advantages(rewards, num_generations, "scalerl")
    batch = compute_advantages(rewards, num_generations, "batch")
    moving = batch != 0
    assert bool(moving.any()) and bool((scalerl[moving].abs() > batch[moving].abs()).all())


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_single_generation_gives_zero_advantages(estimator):
    # G = 1: no group baseline exists, every advantage is 0 (also with NaN and with non-binary rewards for maxrl).
    check(compute_advantages(t64([1, 0, NAN, 1]), 1, estimator), [0, 0, 0, 0])


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_all_nan_batch_gives_zero_advantages(estimator):
    check(compute_advantages(t64([NAN] * 4), 2, estimator), [0, 0, 0, 0])


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------


def test_unknown_estimator_lists_the_allowed_names():
    with pytest.raises(ValueError, match="Allowed values") as info:
        compute_advantages(t64([1, 0]), 2, "ppo")
    for name in ESTIMATORS + TOKEN_LEVEL_ESTIMATORS:
        assert name in str(info.value)
    assert set(ADVANTAGE_ESTIMATORS.names()) == set(ESTIMATORS + TOKEN_LEVEL_ESTIMATORS)


def test_batch_not_a_multiple_of_num_generations_raises():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        compute_advantages(t64([1, 0, 1, 0]), 3, "grpo")


@pytest.mark.parametrize("num_generations", [1, 2])
def test_rewards_must_be_one_dimensional(num_generations):
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages(t64([[1, 0], [0, 1]]), num_generations, "grpo")


# ---------------------------------------------------------------------------------------------------------------------
# nan_std
# ---------------------------------------------------------------------------------------------------------------------


def test_nan_std_matches_torch_std_without_nan_and_ignores_nan():
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert_close(nan_std(x, dim=1), torch.std(x, dim=1), rtol=1e-12, atol=1e-14)
    assert_close(nan_std(x, dim=0, keepdim=True), torch.std(x, dim=0, keepdim=True), rtol=1e-12, atol=1e-14)
    # [1, NaN, 2, 4]: std of [1, 2, 4] = sqrt(((-4/3)^2 + (-1/3)^2 + (5/3)^2) / 2) = sqrt(7/3)
    # [NaN, 3, NaN, NaN]: a single value -> NaN (Bessel's correction needs 2).
    out = nan_std(t64([[1, NAN, 2, 4], [NAN, 3, NAN, NAN]]), dim=1)
    assert_close(out[0], t64(math.sqrt(7 / 3)), rtol=1e-12, atol=0)
    assert torch.isnan(out[1])


def test_nan_std_over_all_elements_is_a_scalar_like_torch_std():
    x = t64([1, 2, 4])
    assert nan_std(x).shape == torch.std(x).shape == torch.Size([])


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference on random inputs
# ---------------------------------------------------------------------------------------------------------------------


def reference_advantages(rewards, num_generations, estimator, threshold=None):
    """docs/algorithms.md's table, one completion at a time; NaN = unscorable -> left out of the statistics, A = 0."""
    if threshold is not None:
        rewards = [r if math.isnan(r) else float(r >= threshold) for r in rewards]
    scored_all = [r for r in rewards if not math.isnan(r)]
    if len(scored_all) >= 2:
        mean_all = sum(scored_all) / len(scored_all)
        batch_std = math.sqrt(sum((r - mean_all) ** 2 for r in scored_all) / (len(scored_all) - 1))
    else:
        batch_std = 0.0
    centred = []
    for start in range(0, len(rewards), num_generations):
        scored = [r for r in rewards[start : start + num_generations] if not math.isnan(r)]
        centred += [r - sum(scored) / len(scored) for r in scored]
    if len(centred) >= 2:
        mean_centred = sum(centred) / len(centred)
        centred_std = math.sqrt(sum((a - mean_centred) ** 2 for a in centred) / (len(centred) - 1))
    else:
        centred_std = 0.0
    out = []
    for start in range(0, len(rewards), num_generations):
        group = rewards[start : start + num_generations]
        scored = [r for r in group if not math.isnan(r)]
        n = len(scored)
        mean = sum(scored) / n if n else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (n - 1)) if n >= 2 else 0.0
        for r in group:
            if math.isnan(r):
                out.append(0.0)
            elif estimator == "grpo":
                out.append((r - mean) / (std + EPS))
            elif estimator == "dr_grpo":
                out.append(r - mean)
            elif estimator == "rloo":
                out.append(r - (sum(scored) - r) / (n - 1) if n >= 2 else 0.0)
            elif estimator == "maxrl":
                out.append((r - mean) / mean if mean > 0 else 0.0)
            elif estimator == "batch":
                out.append((r - mean) / (batch_std + EPS))
            elif estimator == "scalerl":
                out.append((r - mean) / (centred_std + EPS))
            elif estimator == "batch_zscore":
                out.append((r - mean_all) / (batch_std + EPS) if len(scored_all) >= 2 else float("nan"))
    return [0.0 if math.isnan(a) else a for a in out]


def random_rewards(seed, binary):
    """A random (P, G) layout with continuous or 0/1 rewards, ~15% NaN, an all-equal group and a 1-scorable group."""
    gen = torch.Generator().manual_seed(seed)
    num_prompts = int(torch.randint(3, 7, (1,), generator=gen))
    num_generations = int(torch.randint(2, 6, (1,), generator=gen))
    if binary:
        rewards = (torch.rand(num_prompts, num_generations, generator=gen) < 0.4).double()
        rewards[0] = 0.0  # a group with success rate 0
    else:
        rewards = torch.randn(num_prompts, num_generations, dtype=torch.float64, generator=gen)
        rewards[0] = 0.75  # an all-equal group (std 0); 0.75 keeps its mean exact
    rewards[torch.rand(num_prompts, num_generations, generator=gen) < 0.15] = NAN
    rewards[1] = NAN
    rewards[1, 0] = 1.0  # a group with a single scorable completion
    return rewards.view(-1), num_generations


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "batch", "scalerl", "batch_zscore"])
def test_matches_reference_on_random_rewards(estimator, seed):
    rewards, num_generations = random_rewards(seed, binary=False)
    expected = reference_advantages(rewards.tolist(), num_generations, estimator)
    check(compute_advantages(rewards, num_generations, estimator), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maxrl_matches_reference_on_random_binary_rewards(seed):
    rewards, num_generations = random_rewards(seed, binary=True)
    expected = reference_advantages(rewards.tolist(), num_generations, "maxrl")
    check(compute_advantages(rewards, num_generations, "maxrl"), expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maxrl_with_threshold_matches_reference_on_random_rewards(seed):
    rewards, num_generations = random_rewards(seed, binary=False)
    expected = reference_advantages(rewards.tolist(), num_generations, "maxrl", threshold=0.1)
    check(compute_advantages(rewards, num_generations, "maxrl", reward_threshold=0.1), expected)


def test_estimators_take_the_options_they_declare():
    rewards = torch.tensor([0.0, 1.0, 0.4, 0.9])
    # One set of options for every estimator: each receives only the parameters it takes (a token-level one its
    # per-token inputs, and returns one advantage per token).
    options = dict(reward_threshold=0.5, epsilon=1e-4, completion_mask=torch.ones(4, 3), beta=0.1)
    for name in ADVANTAGE_ESTIMATORS.names():
        expected = (4, 3) if ADVANTAGE_ESTIMATORS.traits(name).token_level else (4,)
        assert compute_advantages(rewards, 2, name, **options).shape == expected
    binarized = compute_advantages(rewards, 2, "maxrl", reward_threshold=0.5)
    assert binarized.tolist() == [-1.0, 1.0, -1.0, 1.0]
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.traits(n).binary_rewards] == ["maxrl"]
