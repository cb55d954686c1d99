"""The importance-sampling correction weight (trl_reasoning/algorithms/importance_sampling.py).

Hand-computed cases, an independent float64 reference with plain Python loops on random inputs, and TRL 1.16's own
code (the block of ``GRPOTrainer._generate_and_score_completions`` that builds the ratio, run as it is) for its modes.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.algorithms.importance_sampling import (
    IMPORTANCE_SAMPLING_MODES,
    TRL_IMPORTANCE_SAMPLING_MODES,
    CorrectionStats,
    check_mode,
    correction_weight,
    effective_sample_size,
    weight_share_changed,
)

NAN = float("nan")


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# ------------------------------------------------------------------------------------------------- hand-computed
OLD = t64([[0.0, math.log(2.0), math.log(4.0)], [math.log(0.25), 0.0, 0.0]])
SAMPLER = t64([[0.0, 0.0, 0.0], [0.0, NAN, 0.0]])
MASK = t64([[1, 1, 1], [1, 1, 0]])
# token ratios: [[1, 2, 4], [0.25, 1 (NaN sampler), 1 (padding)]]


@pytest.mark.parametrize(
    ("mode", "clip_min", "clip_max", "expected"),
    [
        ("token_truncate", 0.5, 3.0, [[1, 2, 3], [0.5, 1, 1]]),
        ("token_mask", 0.5, 3.0, [[1, 2, 0], [0, 1, 1]]),
        ("token_icepop", 0.5, 5.0, [[1, 2, 4], [0, 1, 1]]),
        ("sequence_truncate", None, 3.0, [[3], [0.25]]),  # products 8 and 0.25
        ("sequence_mask", 0.5, 10.0, [[8], [0]]),
        # geometric means: (1*2*4)^(1/3) = 2; the second row has one known token: 0.25
        ("sequence_geo_truncate", 0.5, 1.5, [[1.5], [0.5]]),
        ("sequence_geo_mask", 0.3, 3.0, [[2], [0]]),
        ("sequence_geo_mask", None, None, [[2], [0.25]]),
    ],
)
def test_hand_computed_weights(mode, clip_min, clip_max, expected):
    weight = correction_weight(OLD, SAMPLER, MASK, mode, clip_min, clip_max)
    assert_close(weight, t64(expected), rtol=1e-12, atol=1e-12)


def test_a_sequence_without_known_sampler_log_probs_has_geometric_weight_one():
    weight = correction_weight(t64([[1.0, 2.0]]), t64([[NAN, NAN]]), t64([[1, 1]]), "sequence_geo_mask", 0.5, 2.0)
    assert weight.tolist() == [[1.0]]


def test_the_weight_carries_no_gradient():
    old = torch.zeros(2, 3, requires_grad=True)
    weight = correction_weight(old, torch.full((2, 3), -0.1), torch.ones(2, 3), "token_truncate", None, 3.0)
    assert not weight.requires_grad


def test_effective_sample_size_by_hand():
    # tokens: weights [1, 2, 3] over the 3 loss tokens of row 0, [0.5, 1] of row 1 -> sum 7.5, squares 15.25, n 5
    weight = t64([[1, 2, 3], [0.5, 1, 9]])
    assert effective_sample_size(weight, MASK, "token_truncate") == pytest.approx(7.5**2 / (5 * 15.25))
    # sequences: every sequence with a loss token counts once
    assert effective_sample_size(t64([[2.0], [1.0]]), MASK, "sequence_mask") == pytest.approx(9 / (2 * 5))
    assert effective_sample_size(t64([[2.0], [2.0]]), MASK, "sequence_geo_mask") == pytest.approx(1.0)
    assert effective_sample_size(torch.zeros(2, 3), MASK, "token_mask") == 0.0


def test_share_of_changed_weights():
    weight = correction_weight(OLD, SAMPLER, MASK, "token_mask", 0.5, 3.0)
    assert weight_share_changed(weight, MASK, "token_mask", 0.5, 3.0) == (2, 5)
    weight = correction_weight(OLD, SAMPLER, MASK, "token_truncate", 0.5, 3.0)
    assert weight_share_changed(weight, MASK, "token_truncate", 0.5, 3.0) == (2, 5)
    weight = correction_weight(OLD, SAMPLER, MASK, "sequence_geo_mask", 0.3, 3.0)
    assert weight_share_changed(weight, MASK, "sequence_geo_mask", 0.3, 3.0) == (1, 2)


def test_unknown_mode_names_the_field_and_the_modes():
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode 'sequence_geo'.*'token_icepop'"):
        check_mode("sequence_geo")


# ------------------------------------------------------------------------------ independent float64 reference
def reference_weight(old, sampler, mask, mode, clip_min, clip_max):
    """Plain Python loops, float64."""
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    rows = []
    for o_row, s_row, m_row in zip(old.tolist(), sampler.tolist(), mask.tolist(), strict=True):
        diffs = [(o - s) * m if not math.isnan(s) else 0.0 for o, s, m in zip(o_row, s_row, m_row, strict=True)]
        if mode.startswith("sequence"):
            total = sum(diffs)
            if "geo" in mode:
                known = sum(1 for s, m in zip(s_row, m_row, strict=True) if m and not math.isnan(s))
                total /= max(known, 1)
            ratios = [math.exp(total)]
        else:
            ratios = [math.exp(d) for d in diffs]
        if mode.endswith("truncate"):
            ratios = [min(max(r, low), high) for r in ratios]
        else:
            ratios = [r if low <= r <= high else 0.0 for r in ratios]
        rows.append(ratios)
    return t64(rows)


def random_inputs(seed: int, batch: int = 6, length: int = 9):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    sampler = old + 0.4 * torch.randn(batch, length, generator=generator, dtype=torch.float64)
    sampler[torch.rand(batch, length, generator=generator) < 0.1] = NAN
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    return old, sampler, mask


@pytest.mark.parametrize("mode", IMPORTANCE_SAMPLING_MODES)
@pytest.mark.parametrize(("clip_min", "clip_max"), [(None, 3.0), (0.5, 2.0), (0.8, None)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_reference_on_random_inputs(mode, clip_min, clip_max, seed):
    old, sampler, mask = random_inputs(seed)
    weight = correction_weight(old, sampler, mask, mode, clip_min, clip_max)
    assert_close(weight, reference_weight(old, sampler, mask, mode, clip_min, clip_max), rtol=1e-12, atol=1e-12)
    values = weight[mask.bool()] if weight.shape == mask.shape else weight[mask.sum(1) > 0].flatten()
    expected_ess = float(values.sum() ** 2 / (values.numel() * (values**2).sum())) if (values**2).sum() > 0 else 0.0
    assert effective_sample_size(weight, mask, mode) == pytest.approx(expected_ess, rel=1e-12)


# ---------------------------------------------------------------------------------------------------- TRL's code
def trl_ratio_block():
    """TRL 1.16's code that builds ``vllm_importance_sampling_ratio`` in ``_generate_and_score_completions``."""
    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    start = next(i for i, line in enumerate(lines) if "per_token_logps_diff = (old_per_token_logps" in line)
    start -= 1  # the `mask = ...` line before it
    end = next(
        i for i in range(start, len(lines)) if "Compute the per-token log probabilities for the ref" in lines[i]
    )
    return textwrap.dedent("\n".join(lines[start:end]))


@pytest.mark.parametrize("mode", TRL_IMPORTANCE_SAMPLING_MODES)
@pytest.mark.parametrize(("clip_min", "clip_max"), [(None, 3.0), (0.5, 2.0), (0.8, None)])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_trl_for_its_modes(mode, clip_min, clip_max, seed):
    old, sampler, mask = (x.float() for x in random_inputs(seed))
    block = trl_ratio_block()
    assert "vllm_importance_sampling_ratio = torch.exp(logps_diff)" in block
    trainer = SimpleNamespace(
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
    )
    scope = dict(
        torch=torch,
        math=math,
        self=trainer,
        completion_mask=mask,
        tool_mask=None,
        old_per_token_logps=old,
        sampling_per_token_logps=sampler,
    )
    exec(block, scope)  # noqa: S102 - TRL's own source, to compare against it
    theirs = scope["vllm_importance_sampling_ratio"]
    ours = correction_weight(old, sampler, mask, mode, clip_min, clip_max)
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


# ------------------------------------------------------------------------------------------------ the metrics
def test_metrics_accumulated_over_micro_batches_equal_the_whole_batch():
    old, sampler, mask = (x.float() for x in random_inputs(3, batch=8))
    for mode in ("token_truncate", "sequence_mask", "sequence_geo_truncate"):
        weight = correction_weight(old, sampler, mask, mode, 0.5, 2.0)
        whole, parts = CorrectionStats(mode, 0.5, 2.0), CorrectionStats(mode, 0.5, 2.0)
        whole.add(old, sampler, mask, weight)
        for rows in (slice(0, 3), slice(3, 8)):
            parts.add(old[rows], sampler[rows], mask[rows], weight[rows])
        ours = parts.reduce(lambda tensor: tensor)
        assert ours == pytest.approx(whole.reduce(lambda tensor: tensor), rel=1e-6)
        difference = (old - sampler).abs()[mask.bool() & ~torch.isnan(sampler)]
        ratios = weight.flatten() if mode.startswith("sequence") else weight[mask.bool()]
        assert ours["sampling/sampling_logp_difference/mean"] == pytest.approx(difference.mean().item(), rel=1e-6)
        assert ours["sampling/sampling_logp_difference/max"] == pytest.approx(difference.max().item())
        assert ours["sampling/importance_sampling_ratio/min"] == pytest.approx(ratios.min().item())
        assert ours["sampling/importance_sampling_ratio/mean"] == pytest.approx(ratios.mean().item(), rel=1e-6)
        assert ours["sampling/importance_sampling_ratio/max"] == pytest.approx(ratios.max().item())
        assert ours["sampling/effective_sample_size"] == pytest.approx(effective_sample_size(weight, mask, mode))


def test_metrics_reduce_over_processes_as_trl_does():
    stats = [CorrectionStats("token_mask", None, 3.0) for _ in range(2)]
    stats[0].add(t64([[0.0, 1.0]]), t64([[0.0, 0.0]]), t64([[1, 1]]), t64([[1.0, 0.0]]))
    stats[1].add(t64([[0.5]]), t64([[0.0]]), t64([[1]]), t64([[2.0]]))
    rows = torch.stack([torch.tensor(s.local_values(), dtype=torch.float64) for s in stats])
    values = stats[0].reduce(lambda _: rows)
    assert values["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 0.5) / 2)  # mean of means
    assert values["sampling/sampling_logp_difference/max"] == pytest.approx(1.0)
    assert values["sampling/importance_sampling_ratio/min"] == 0.0
    assert values["sampling/importance_sampling_ratio/mean"] == pytest.approx((0.5 + 2.0) / 2)
    assert values["sampling/importance_sampling_ratio/max"] == 2.0
    assert values["sampling/effective_sample_size"] == pytest.approx(9 / (3 * 5))  # all weights together
    assert stats[0].ratio_count == 0  # reset for the next generation batch
