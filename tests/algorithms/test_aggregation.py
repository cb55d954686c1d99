"""Loss aggregation (trl_reasoning/algorithms/aggregation.py) against docs/algorithms.md ("Loss aggregation").

Every mode is ``L = sum_{i,t} w_i l_it m_it`` with per-completion weights fixed on the whole batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.algorithms.aggregation import AGGREGATIONS, aggregate_loss, completion_weights

MODES = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "seq_mean_token_sum",
    "prompt_mean",
    "micro_batch_token_mean",
)
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------------
# Hand-computed cases. Batch: P = 2 prompts, G = 2, token counts [2, 0 | 3, 1], L_max = 4, N = 4.
# ---------------------------------------------------------------------------------------------------------------------

COUNTS = [2, 0, 3, 1]
HAND_WEIGHTS = {
    "token_mean": [1 / 6] * 4,  # 1 / (2 + 0 + 3 + 1)
    "seq_mean_token_mean": [1 / 8, 0.0, 1 / 12, 1 / 4],  # 1 / (N |y_i|) = 1/(4*2), 0 (empty row), 1/(4*3), 1/(4*1)
    "seq_mean_token_sum_norm": [1 / 16] * 4,  # 1 / (N L_max) = 1 / (4 * 4)
    "seq_mean_token_sum": [1 / 4] * 4,  # 1 / N
    "prompt_mean": [1 / 4, 1 / 4, 1 / 8, 1 / 8],  # 1 / (P * group tokens): 1 / (2 * (2 + 0)), 1 / (2 * (3 + 1))
    "micro_batch_token_mean": [1 / 6] * 4,  # token_mean over the rows it is given (here: the whole "micro-batch")
}
# Per-token losses; only the first |y_i| tokens of each row are unmasked. Row sums: 1 + 2 = 3, 0, 3 + 1 + 2 = 6, 4.
PER_TOKEN = [[1, 2, 9], [5, 5, 5], [3, 1, 2], [4, 7, 7]]
HAND_LOSS = {
    "token_mean": 13 / 6,  # (3 + 0 + 6 + 4) / 6
    "seq_mean_token_mean": 1.875,  # (3/2 + 0 + 6/3 + 4/1) / 4 = 7.5 / 4 (the empty row counts in N)
    "seq_mean_token_sum_norm": 0.8125,  # 13 / 16
    "seq_mean_token_sum": 3.25,  # 13 / 4
    "prompt_mean": 2.0,  # group 1: (3 + 0) / 2 = 1.5; group 2: (6 + 4) / 4 = 2.5; mean over prompts = 2
    "micro_batch_token_mean": 13 / 6,  # token_mean of the rows given
}


def hand_mask():
    return t64([[1.0 if k < c else 0.0 for k in range(3)] for c in COUNTS])


@pytest.mark.parametrize("mode", MODES)
def test_completion_weights_hand_cases(mode):
    weights = completion_weights(t64(COUNTS), mode, num_generations=2, max_completion_length=4)
    assert_close(weights, t64(HAND_WEIGHTS[mode]), **TIGHT)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_loss_hand_cases(mode):
    loss = aggregate_loss(t64(PER_TOKEN), hand_mask(), mode, num_generations=2, max_completion_length=4)
    assert_close(loss, t64(HAND_LOSS[mode]), **TIGHT)


def test_rows_without_unmasked_tokens_get_weight_zero():
    # A completion with |y| = 0 (e.g. truncated and filtered) must not produce inf/NaN weights.
    assert completion_weights(t64([0, 5]), "seq_mean_token_mean").tolist() == [0.0, 0.1]  # 1 / (2 * 5)
    # A whole group without tokens: prompt_mean gives it 0, the other group 1 / (P * 4) = 1/8.
    weights = completion_weights(t64([0, 0, 3, 1]), "prompt_mean", num_generations=2)
    assert_close(weights, t64([0.0, 0.0, 1 / 8, 1 / 8]), **TIGHT)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_batch_gives_zero_loss(mode):
    loss = aggregate_loss(
        t64(PER_TOKEN), torch.zeros(4, 3, dtype=torch.float64), mode, num_generations=2, max_completion_length=4
    )
    assert loss.item() == 0.0


def test_prompt_mean_weighs_prompts_equally_despite_unequal_token_counts():
    # Group 1 has 2 tokens, group 2 has 20: each group still contributes half. Per-token loss 1 everywhere.
    mask = t64([[1, 1] + [0] * 8, [0] * 10, [1] * 10, [1] * 10])
    loss = aggregate_loss(torch.ones(4, 10, dtype=torch.float64), mask, "prompt_mean", num_generations=2)
    assert_close(loss, t64(1.0), **TIGHT)
    weights = completion_weights(mask.sum(-1), "prompt_mean", num_generations=2)
    assert_close(weights, t64([1 / 4, 1 / 4, 1 / 40, 1 / 40]), **TIGHT)  # 1 / (2 * 2), 1 / (2 * 20)


def test_micro_batch_token_mean_depends_on_the_split_and_only_it_is_registered_per_micro_batch():
    # TRL's bnpo: each micro-batch is normalised by its own tokens. Split the hand batch into rows {0, 1} (2 tokens)
    # and {2, 3} (4 tokens): the summed micro-batch losses (3 + 0) / 2 + (6 + 4) / 4 = 4.0, not the batch mean 13/6.
    mask = hand_mask()
    halves = [slice(0, 2), slice(2, 4)]
    split_total = sum(
        aggregate_loss(t64(PER_TOKEN)[rows], mask[rows], "micro_batch_token_mean").item() for rows in halves
    )
    assert math.isclose(split_total, 4.0)
    per_micro_batch = [m for m in AGGREGATIONS.names() if AGGREGATIONS.traits(m).per_micro_batch]
    assert per_micro_batch == ["micro_batch_token_mean"]


def test_explicit_weights_are_used_as_given():
    # L = sum_i w_i sum_t l_it m_it = 0.5 * 3 + 2 * 0 + 0.25 * 6 + 1 * 4 = 7
    loss = aggregate_loss(t64(PER_TOKEN), hand_mask(), weights=t64([0.5, 2.0, 0.25, 1.0]))
    assert_close(loss, t64(7.0), **TIGHT)


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------


def test_unknown_mode_lists_the_allowed_names():
    with pytest.raises(ValueError, match="Allowed values") as info:
        completion_weights(t64(COUNTS), "sum")
    for name in MODES:
        assert name in str(info.value)
    assert set(AGGREGATIONS.names()) == set(MODES)


@pytest.mark.parametrize("max_completion_length", [None, 0])
def test_seq_mean_token_sum_norm_needs_max_completion_length(max_completion_length):
    with pytest.raises(ValueError, match="max_completion_length"):
        completion_weights(t64(COUNTS), "seq_mean_token_sum_norm", max_completion_length=max_completion_length)


@pytest.mark.parametrize("num_generations", [None, 0, 3])
def test_prompt_mean_needs_a_dividing_num_generations(num_generations):
    with pytest.raises(ValueError, match="num_generations"):
        completion_weights(t64(COUNTS), "prompt_mean", num_generations=num_generations)


def test_aggregate_loss_needs_mode_or_weights():
    with pytest.raises(ValueError, match="mode"):
        aggregate_loss(t64(PER_TOKEN), hand_mask())


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference on random inputs
# ---------------------------------------------------------------------------------------------------------------------


def reference_weights(counts, mode, num_generations, max_completion_length):
    """docs/algorithms.md's ``w_i`` with plain Python; a completion (or group) without tokens gets 0 where w_i ~ 1/|y|."""
    n = len(counts)
    num_prompts = n // num_generations
    out = []
    for i, c in enumerate(counts):
        if mode in ("token_mean", "micro_batch_token_mean"):  # the rows given are the micro-batch
            out.append(1 / sum(counts))
        elif mode == "seq_mean_token_mean":
            out.append(1 / (n * c) if c else 0.0)
        elif mode == "seq_mean_token_sum_norm":
            out.append(1 / (n * max_completion_length))
        elif mode == "seq_mean_token_sum":
            out.append(1 / n)
        elif mode == "prompt_mean":
            start = i // num_generations * num_generations
            group_tokens = sum(counts[start : start + num_generations])
            out.append(1 / (num_prompts * group_tokens) if group_tokens else 0.0)
    return out


def random_case(seed):
    """Random (P*G, T) layout, mask with holes, one empty row and (when P > 2) one empty group; finite padding."""
    gen = torch.Generator().manual_seed(seed)
    num_prompts = int(torch.randint(3, 6, (1,), generator=gen))
    num_generations = int(torch.randint(2, 5, (1,), generator=gen))
    n, t = num_prompts * num_generations, int(torch.randint(4, 10, (1,), generator=gen))
    lengths = torch.randint(0, t + 1, (n,), generator=gen)
    mask = (torch.arange(t) < lengths[:, None]) & (torch.rand(n, t, generator=gen) > 0.2)
    mask[1] = False
    mask[num_generations : 2 * num_generations] = False  # prompt 1's whole group is empty
    mask[-1, 0] = True
    logps = torch.log(0.05 + 0.9 * torch.rand(n, t, dtype=torch.float64, generator=gen))
    coef = torch.randn(2, n, t, dtype=torch.float64, generator=gen)
    return logps, mask.double(), coef, num_generations, t + 3


def smooth_loss(logps, coef):
    """A per-token loss with a closed-form derivative: l = a exp(lp) + b lp^2, dl/dlp = a exp(lp) + 2 b lp."""
    return coef[0] * torch.exp(logps) + coef[1] * logps**2


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_matches_reference_values_and_gradients(mode, seed):
    logps, mask, coef, num_generations, max_len = random_case(seed)
    n, t = mask.shape
    counts = [int(c) for c in mask.sum(-1).tolist()]
    w = reference_weights(counts, mode, num_generations, max_len)

    weights = completion_weights(mask.sum(-1), mode, num_generations=num_generations, max_completion_length=max_len)
    assert weights.dtype == torch.float64
    assert_close(weights, t64(w), **TIGHT)

    x = logps.clone().requires_grad_(True)
    loss = aggregate_loss(
        smooth_loss(x, coef), mask, mode, num_generations=num_generations, max_completion_length=max_len
    )
    (grad,) = torch.autograd.grad(loss, x)

    # Reference value with loops; reference gradient in closed form: dL/dlp_it = w_i m_it (a e^lp + 2 b lp).
    lp, a, b, m = logps.tolist(), coef[0].tolist(), coef[1].tolist(), mask.tolist()
    ref_loss = sum(
        w[i] * (a[i][k] * math.exp(lp[i][k]) + b[i][k] * lp[i][k] ** 2) * m[i][k] for i in range(n) for k in range(t)
    )
    ref_grad = [
        [w[i] * m[i][k] * (a[i][k] * math.exp(lp[i][k]) + 2 * b[i][k] * lp[i][k]) for k in range(t)] for i in range(n)
    ]
    assert_close(loss.detach(), t64(ref_loss), **TIGHT)
    assert_close(grad, t64(ref_grad), **TIGHT)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_split_into_micro_batches_gives_the_same_loss_and_gradient(mode, seed):
    # Weights fixed on the whole batch: summing the micro-batch losses (any split) equals the full-batch loss.
    logps, mask, coef, num_generations, max_len = random_case(seed)
    weights = completion_weights(mask.sum(-1), mode, num_generations=num_generations, max_completion_length=max_len)
    x = logps.clone().requires_grad_(True)
    full = aggregate_loss(
        smooth_loss(x, coef), mask, mode, num_generations=num_generations, max_completion_length=max_len
    )
    (full_grad,) = torch.autograd.grad(full, x)

    y = logps.clone().requires_grad_(True)
    per_token = smooth_loss(y, coef)
    bounds = [0, 1, 2 + seed, mask.shape[0]]  # uneven slices that cut through groups
    split = sum(
        aggregate_loss(per_token[lo:hi], mask[lo:hi], weights=weights[lo:hi]) for lo, hi in zip(bounds, bounds[1:])
    )
    (split_grad,) = torch.autograd.grad(split, y)
    assert_close(split, full.detach(), **TIGHT)
    assert_close(split_grad, full_grad, **TIGHT)


def test_integer_mask_gives_float64_accurate_loss():
    logps, mask, coef, _, _ = random_case(0)
    per_token = smooth_loss(logps, coef)
    expected = aggregate_loss(per_token, mask, "token_mean")  # float64 mask: float64 weights
    assert_close(aggregate_loss(per_token, mask.bool(), "token_mean"), expected, **TIGHT)
