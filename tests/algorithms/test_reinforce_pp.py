"""REINFORCE++'s token-level estimators (``reinforce_pp``, ``reinforce_pp_baseline``) and their k1 KL, against
docs/algorithms.md ("REINFORCE++"): hand-computed cases, then an independent float64 reference written with plain
Python loops over tokens, for the advantages and for the gradient of the clipped loss they weight."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    per_completion,
    reinforce_pp_returns,
    whiten_over_tokens,
)
from trl_reasoning.algorithms.aggregation import aggregate_loss
from trl_reasoning.algorithms.batch import batch_advantages_and_weights
from trl_reasoning.algorithms.losses import compute_policy_loss
from trl_reasoning.algorithms.shaping import token_kl

NAN = float("nan")
FLOOR = 1e-8  # OpenRLHF's variance floor
ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def check(actual, expected):
    assert actual.dtype == torch.float64
    assert_close(actual, t64(expected), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------------------------------

# Two completions of one prompt: 3 tokens and 2 tokens (the third is padding, whose KL must not count).
REWARDS = [1.0, 0.0]
MASK = [[1, 1, 1], [1, 1, 0]]
KL = [[0.1, 0.2, 0.3], [0.5, -0.1, 9.0]]


def test_returns_sum_the_kl_penalty_from_each_token_to_the_end():
    # beta = 0.5. Row 0: 1 - 0.5 (0.1 + 0.2 + 0.3) = 0.7, 1 - 0.5 (0.2 + 0.3) = 0.75, 1 - 0.5 * 0.3 = 0.85.
    # Row 1: 0 - 0.5 (0.5 - 0.1) = -0.2, 0 - 0.5 * (-0.1) = 0.05; its padding token is 0 (its 9.0 never counts).
    returns = reinforce_pp_returns(t64(REWARDS), t64(KL), t64(MASK), beta=0.5)
    check(returns, [[0.7, 0.75, 0.85], [-0.2, 0.05, 0.0]])


def test_reinforce_pp_on_a_two_by_three_batch():
    # Returns [0.7, 0.75, 0.85, -0.2, 0.05] over the 5 counted tokens: mean 2.15 / 5 = 0.43; deviations 0.27, 0.32,
    # 0.42, -0.63, -0.38; biased variance (0.0729 + 0.1024 + 0.1764 + 0.3969 + 0.1444) / 5 = 0.1786, std 0.42261093.
    a = [0.27 / 0.4226109321823088, 0.32 / 0.4226109321823088, 0.42 / 0.4226109321823088]
    b = [-0.63 / 0.4226109321823088, -0.38 / 0.4226109321823088]
    expected = [a, b + [0.0]]
    kwargs = dict(completion_mask=t64(MASK), token_kl=t64(KL), beta=0.5)
    check(compute_advantages(t64(REWARDS), 2, "reinforce_pp", **kwargs), expected)
    # One group: subtracting its mean shifts every return by 0.5, which the batch mean takes back.
    check(compute_advantages(t64(REWARDS), 2, "reinforce_pp_baseline", **kwargs), expected)
    # The completions table's number: the first token's advantage (the whole completion's normalised return).
    check(per_completion(compute_advantages(t64(REWARDS), 2, "reinforce_pp", **kwargs)), [a[0], b[0]])


def test_baseline_centres_on_the_group_and_scales_by_the_biased_batch_std():
    # Groups [1, 0] and [1, 1], one token each, no KL: centred [0.5, -0.5, 0, 0], biased variance 0.5 / 4 = 0.125,
    # so A = +-0.5 / sqrt(0.125) = +-1.41421356 (Bessel's std, ScaleRL's, would give +-1.22474487). Without the group
    # baseline the rewards [1, 0, 1, 1] have mean 0.75 and variance 0.1875.
    mask = torch.ones(4, 1, dtype=torch.float64)
    baseline = compute_advantages(t64([1, 0, 1, 1]), 2, "reinforce_pp_baseline", completion_mask=mask)
    check(baseline, [[2**0.5], [-(2**0.5)], [0], [0]])
    plain = [0.25 / 0.1875**0.5, -0.75 / 0.1875**0.5, 0.25 / 0.1875**0.5, 0.25 / 0.1875**0.5]
    check(compute_advantages(t64([1, 0, 1, 1]), 2, "reinforce_pp", completion_mask=mask), [[a] for a in plain])


def test_beta_zero_weighs_each_completion_by_its_length():
    # No KL: every token of a completion carries r_i. Over the 5 tokens (3 of reward 1, 2 of reward 0): mean 0.6,
    # biased variance (3 * 0.16 + 2 * 0.36) / 5 = 0.24, so A = 0.4 / 0.48989795 = 0.81649658 and -0.6 / ... = -1.22474487.
    a, b = 0.8164965809277261, -1.2247448713915892
    kwargs = dict(completion_mask=t64(MASK), token_kl=t64(KL), beta=0.0)
    check(compute_advantages(t64(REWARDS), 2, "reinforce_pp", **kwargs), [[a, a, a], [b, b, 0]])


def test_a_batch_with_one_value_is_not_divided_by_zero():
    # All returns equal: the variance 0 is floored at 1e-8 (rsqrt: 1e4), and the deviations are 0.
    mask = torch.ones(2, 2, dtype=torch.float64)
    check(compute_advantages(t64([1, 1]), 2, "reinforce_pp", completion_mask=mask), [[0, 0], [0, 0]])


def test_an_unscorable_completion_gets_zero_and_is_left_out_of_the_statistics():
    mask = t64([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    kl = t64([[0.1, 0.2, 0.3], [0.5, -0.1, 0.0], [0.7, 0.0, 0.0], [0.2, 0.2, 0.0]])
    rewards = t64([1.0, 0.0, NAN, 3.0])
    for estimator in ESTIMATORS:
        out = compute_advantages(rewards, 2, estimator, completion_mask=mask, token_kl=kl, beta=0.5)
        assert out[2].tolist() == [0.0, 0.0, 0.0]
        # the same as the batch without row 2 (for the baseline, its group keeps the one scored reward)
        kept = [0, 1, 3]
        alone = whiten_over_tokens(
            reinforce_pp_returns(_centred(rewards, 2) if "baseline" in estimator else rewards, kl, mask, 0.5)[kept],
            mask[kept],
        )
        assert_close(out[kept], alone, rtol=1e-12, atol=1e-12)


def _centred(rewards, num_generations):
    grouped = rewards.view(-1, num_generations)
    return (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).view(-1)


def test_token_kl_is_k1_clamped_to_ten_masked_and_without_gradient():
    old = t64([[-1.0, -2.0, -30.0], [-0.5, -40.0, -3.0]]).requires_grad_()
    ref = t64([[-1.5, -1.0, -5.0], [-0.5, -1.0, -1.0]])
    mask = t64([[1, 1, 1], [1, 1, 0]])
    kl = token_kl(old, ref, mask)
    # log pi_old - log pi_ref: 0.5, -1, -25 -> -10 (clamped); 0, -39 -> -10; padding 0.
    check(kl, [[0.5, -1.0, -10.0], [0.0, -10.0, 0.0]])
    assert not kl.requires_grad


# ---------------------------------------------------------------------------------------------------------------------
# Shapes, options and errors
# ---------------------------------------------------------------------------------------------------------------------


def test_registered_as_token_level_variants_with_the_kl_in_their_return():
    for name in ESTIMATORS:
        assert ADVANTAGE_ESTIMATORS.traits(name).token_level and ADVANTAGE_ESTIMATORS.traits(name).kl_in_return
    assert ADVANTAGE_ESTIMATORS.traits("reinforce_pp_baseline").group_relative
    assert not ADVANTAGE_ESTIMATORS.traits("reinforce_pp").group_relative  # the paper's k >= 1 variant
    assert ADVANTAGE_ESTIMATORS.with_trait("token_level") == ESTIMATORS


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_single_generation_gives_zero_advantages_per_token(estimator):
    mask = torch.ones(3, 4, dtype=torch.float64)
    out = compute_advantages(t64([1, 0, 1]), 1, estimator, completion_mask=mask)
    assert out.shape == (3, 4) and not out.any()


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_missing_completion_mask_is_an_error(estimator):
    with pytest.raises(ValueError, match=r"per token: pass completion_mask"):
        compute_advantages(t64([1, 0]), 2, estimator)


def test_normalize_advantages_is_refused_for_token_level_advantages():
    with pytest.raises(ValueError, match=r"gives one per token and normalises them over the batch itself"):
        compute_advantages(t64([1, 0]), 2, "reinforce_pp", normalize=True, completion_mask=torch.ones(2, 3))


def test_dropped_groups_get_zero_and_leave_the_statistics_to_the_groups_that_train():
    rewards, kl, mask, num_generations = random_batch(3)
    groups = rewards.numel() // num_generations
    active = torch.tensor([g % 2 == 0 for g in range(groups)])
    rows = active.repeat_interleave(num_generations)
    counts = mask.sum(dim=1)
    inputs = dict(completion_mask=mask, token_kl=kl, beta=0.3)
    for estimator in ESTIMATORS:
        advantages, _, active_rows = batch_advantages_and_weights(
            rewards, counts, num_generations, estimator, "token_mean", None, active, **inputs
        )
        assert torch.equal(active_rows, rows) and not advantages[~rows].any()
        alone = compute_advantages(
            rewards[rows], num_generations, estimator, completion_mask=mask[rows], token_kl=kl[rows], beta=0.3
        )
        assert_close(advantages[rows], alone, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference on random inputs
# ---------------------------------------------------------------------------------------------------------------------


def reference_advantages(rewards, kl, mask, beta, num_generations, baseline):
    """docs/algorithms.md, one token at a time: the (group-centred) reward, minus beta times the KL summed from the
    token to the end over counted tokens; then the mean and the biased variance over every counted token of scored
    completions, the variance floored at 1e-8. Uncounted tokens and unscorable completions get 0."""
    rows, width = len(rewards), len(mask[0])
    r = list(rewards)
    if baseline:
        for start in range(0, rows, num_generations):
            scored = [x for x in rewards[start : start + num_generations] if not math.isnan(x)]
            mean = sum(scored) / len(scored) if scored else NAN
            for i in range(start, start + num_generations):
                r[i] = rewards[i] - mean
    returns = [[None] * width for _ in range(rows)]
    for i in range(rows):
        for t in range(width):
            if mask[i][t] and not math.isnan(r[i]):
                returns[i][t] = r[i] - beta * sum(kl[i][s] for s in range(t, width) if mask[i][s])
    values = [g for row in returns for g in row if g is not None]
    mean = sum(values) / len(values)
    std = math.sqrt(max(sum((g - mean) ** 2 for g in values) / len(values), FLOOR))
    return [[0.0 if g is None else (g - mean) / std for g in row] for row in returns]


def random_batch(seed):
    """(P, G) completions of random lengths (one of length 0), an interior uncounted token (tool output), one
    unscorable completion, and padding whose KL is huge (it must never count)."""
    gen = torch.Generator().manual_seed(seed)
    num_prompts = int(torch.randint(2, 5, (1,), generator=gen))
    num_generations = int(torch.randint(2, 5, (1,), generator=gen))
    rows, width = num_prompts * num_generations, int(torch.randint(3, 8, (1,), generator=gen))
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[1] = 0
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).double()
    mask[0, : min(2, width)] = 1.0
    mask[0, 1] = 0.0  # a tool-output token inside completion 0
    kl = torch.randn(rows, width, dtype=torch.float64, generator=gen) * 0.5
    kl = torch.where(mask.bool(), kl, torch.full_like(kl, 1e6))
    rewards = torch.randn(rows, dtype=torch.float64, generator=gen)
    rewards[-1] = NAN
    return rewards, kl, mask, num_generations


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_matches_the_reference_on_random_batches(estimator, seed):
    rewards, kl, mask, num_generations = random_batch(seed)
    beta = 0.3
    expected = reference_advantages(
        rewards.tolist(), kl.tolist(), mask.tolist(), beta, num_generations, estimator == "reinforce_pp_baseline"
    )
    out = compute_advantages(rewards, num_generations, estimator, completion_mask=mask, token_kl=kl, beta=beta)
    check(out, expected)
    assert not out[mask == 0].any(), "a padding or tool-output token got an advantage"


def reference_clip_loss_and_gradient(logps, old_logps, advantages, mask, epsilon):
    """The token-mean clipped loss -min(rho A, clip(rho) A) / n over counted tokens, and its gradient with respect to
    each log-prob: -A rho / n where the unclipped term is the smaller one (or the ratio is inside the clip), else 0."""
    count = sum(sum(row) for row in mask)
    loss, grad = 0.0, [[0.0] * len(row) for row in mask]
    for i, row in enumerate(mask):
        for t, counted in enumerate(row):
            if not counted:
                continue
            rho, a = math.exp(logps[i][t] - old_logps[i][t]), advantages[i][t]
            clipped = min(max(rho, 1 - epsilon), 1 + epsilon)
            loss += -min(rho * a, clipped * a) / count
            if 1 - epsilon <= rho <= 1 + epsilon or rho * a < clipped * a:
                grad[i][t] = -a * rho / count
    return loss, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_clipped_loss_and_its_gradient_match_the_reference(estimator, seed):
    rewards, kl, mask, num_generations = random_batch(seed)
    advantages = compute_advantages(rewards, num_generations, estimator, completion_mask=mask, token_kl=kl, beta=0.3)
    gen = torch.Generator().manual_seed(100 + seed)
    old = -torch.rand(mask.shape, dtype=torch.float64, generator=gen) * 3
    logps = (old + torch.randn(mask.shape, dtype=torch.float64, generator=gen) * 0.3).requires_grad_()
    per_token = compute_policy_loss("clip", logps, old, advantages, mask, epsilon_low=0.2, epsilon_high=0.2)
    loss = aggregate_loss(per_token, mask, "token_mean")
    loss.backward()
    expected_loss, expected_grad = reference_clip_loss_and_gradient(
        logps.detach().tolist(), old.tolist(), advantages.tolist(), mask.tolist(), 0.2
    )
    assert_close(loss.detach(), t64(expected_loss), rtol=1e-10, atol=1e-12)
    check(logps.grad, expected_grad)
    assert logps.grad[mask == 0].abs().sum() == 0


# ---------------------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padding_gets_zero_and_does_not_move_the_statistics(seed):
    rewards, kl, mask, num_generations = random_batch(seed)
    # three more columns of padding whose KL is NaN or huge, and the same with no padding beyond the longest row
    wider_mask = torch.cat([mask, torch.zeros(mask.shape[0], 3, dtype=torch.float64)], dim=1)
    wider_kl = torch.cat([kl, t64([[NAN, 1e9, -1e9]] * mask.shape[0])], dim=1)
    for estimator in ESTIMATORS:
        narrow = compute_advantages(rewards, num_generations, estimator, completion_mask=mask, token_kl=kl, beta=0.3)
        wide = compute_advantages(
            rewards, num_generations, estimator, completion_mask=wider_mask, token_kl=wider_kl, beta=0.3
        )
        assert_close(wide[:, : mask.shape[1]], narrow, rtol=1e-12, atol=1e-14)  # the sums run over more zeros
        assert not wide[:, mask.shape[1] :].any() and not torch.isnan(wide).any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_baseline_variant_is_reinforce_pp_on_group_centred_rewards(seed):
    rewards, kl, mask, num_generations = random_batch(seed)
    inputs = dict(completion_mask=mask, token_kl=kl, beta=0.3)
    baseline = compute_advantages(rewards, num_generations, "reinforce_pp_baseline", **inputs)
    centred = compute_advantages(_centred(rewards, num_generations), num_generations, "reinforce_pp", **inputs)
    assert_close(baseline, centred, rtol=0, atol=0)
    plain = compute_advantages(rewards, num_generations, "reinforce_pp", **inputs)
    assert not torch.allclose(baseline, plain), "the group baseline changed nothing: the test cannot fail"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_beta_zero_is_the_sequence_reward_broadcast_then_normalised_over_tokens(estimator, seed):
    rewards, kl, mask, num_generations = random_batch(seed)
    out = compute_advantages(rewards, num_generations, estimator, completion_mask=mask, token_kl=kl, beta=0.0)
    assert torch.equal(out, compute_advantages(rewards, num_generations, estimator, completion_mask=mask))
    sequence = _centred(rewards, num_generations) if estimator == "reinforce_pp_baseline" else rewards
    lengths = mask.sum(dim=1)
    scored = ~torch.isnan(sequence)
    # each completion's reward counted once per token: a length-weighted mean and biased variance
    mean = (sequence[scored] * lengths[scored]).sum() / lengths[scored].sum()
    variance = ((sequence[scored] - mean) ** 2 * lengths[scored]).sum() / lengths[scored].sum()
    broadcast = torch.nan_to_num((sequence - mean) / variance.sqrt()).unsqueeze(1) * mask
    assert_close(out, broadcast, rtol=1e-10, atol=1e-12)
    # with beta > 0 the advantages vary along a completion
    varying = compute_advantages(rewards, num_generations, estimator, completion_mask=mask, token_kl=kl, beta=0.3)
    assert any(len(set(row[m.bool()].tolist())) > 1 for row, m in zip(varying, mask))
