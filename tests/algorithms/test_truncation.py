"""The sampler's truncated distribution (trl_reasoning/algorithms/truncation.py) and the chunked log-probs scored on it
(trl_reasoning/algorithms/logprobs.py with ``truncation``): hand values, HF ``generate``'s own warpers, and an independent float64
formula (plain Python over each position's distribution) for the values and the gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers import LogitsProcessorList, MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from trl_reasoning.algorithms.logprobs import chunked_logps, chunked_logps_from_hidden
from trl_reasoning.algorithms.truncation import (
    SamplingTruncation,
    sampling_truncation,
    support_mask,
    truncated_log_probs,
)


def test_supports_and_renormalised_log_probs_by_hand():
    z = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).log()
    # top-p 0.7: from the least likely up, 0.05 and 0.05 + 0.15 are <= 0.3 and go; 0.5 and 0.3 remain
    assert support_mask(z, SamplingTruncation(top_p=0.7)).tolist() == [True, True, False, False]
    assert support_mask(z, SamplingTruncation(top_k=3)).tolist() == [True, True, True, False]
    # min-p 0.5: below 0.5 * 0.5 = 0.25 goes
    assert support_mask(z, SamplingTruncation(min_p=0.5)).tolist() == [True, True, False, False]
    # top-k 3 first (0.5, 0.3, 0.15 renormalised over 0.95), then top-p 0.6 on those: 0.15/0.95 <= 0.4 goes
    assert support_mask(z, SamplingTruncation(top_k=3, top_p=0.6)).tolist() == [True, True, False, False]
    ids = torch.tensor([0, 1, 2, 3])
    logps = truncated_log_probs(z.expand(4, 4), ids, SamplingTruncation(top_p=0.7))
    # kept tokens: renormalised over 0.8; a sampled token outside the support is kept in it (its own mass added)
    want = [math.log(0.5 / 0.8), math.log(0.3 / 0.8), math.log(0.15 / 0.95), math.log(0.05 / 0.85)]
    assert_close(logps, torch.tensor(want, dtype=torch.float64))
    assert_close(truncated_log_probs(z, torch.tensor(2), SamplingTruncation()), z[2])  # no truncation: log p


def test_settings_are_checked_and_read_as_trl_passes_them():
    with pytest.raises(ValueError, match="top_p"):
        SamplingTruncation(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingTruncation(top_k=-1)
    with pytest.raises(ValueError, match="min_p"):
        SamplingTruncation(min_p=1.5)
    assert not sampling_truncation(0, 1.0, None).truncates
    assert not sampling_truncation(-1, None, 0.0).truncates  # vLLM's top_k=-1 is off
    assert sampling_truncation(0, 1.0, None, {"top_p": 0.9}) == SamplingTruncation(top_p=0.9)
    assert sampling_truncation(50, 0.95, 0.1) == SamplingTruncation(top_k=50, top_p=0.95, min_p=0.1)


@pytest.mark.parametrize(
    "truncation",
    [
        SamplingTruncation(top_k=7),
        SamplingTruncation(top_p=0.8),
        SamplingTruncation(min_p=0.05),
        SamplingTruncation(top_k=20, top_p=0.9, min_p=0.02),
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_the_support_is_hf_generates(truncation):
    torch.manual_seed(0)
    z = torch.randn(64, 50) * 2.5
    warpers = LogitsProcessorList()
    if truncation.top_k:
        warpers.append(TopKLogitsWarper(truncation.top_k))
    if truncation.top_p < 1:
        warpers.append(TopPLogitsWarper(truncation.top_p))
    if truncation.min_p:
        warpers.append(MinPLogitsWarper(truncation.min_p))
    hf = warpers(torch.zeros(64, 1, dtype=torch.long), z.clone())
    mask = support_mask(z, truncation)
    assert torch.equal(mask, hf > -math.inf)
    assert 1 < mask.sum(-1).float().mean() < 50, "the case does not truncate"


def _vllm_support(probs: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """vLLM's order, stated plainly: min-p on the whole distribution, then top-k, then the nucleus of what is left
    (renormalised), the most likely tokens in order while the mass before each is < top_p."""
    kept = {j for j, p in enumerate(probs) if p >= min_p * max(probs)} if min_p else set(range(len(probs)))
    if top_k:
        kept = set(sorted(kept, key=lambda j: -probs[j])[:top_k])
    total, before, nucleus = sum(probs[j] for j in kept), 0.0, set()
    for j in sorted(kept, key=lambda j: -probs[j]):
        if before < top_p:
            nucleus.add(j)
        before += probs[j] / total
    return nucleus


def test_vllm_truncates_in_its_own_order():
    """min-p then top-p (vLLM) keeps another support than top-p then min-p (generate): here 2 tokens against 3."""
    z = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    generate = support_mask(z, SamplingTruncation(top_p=0.75, min_p=0.3))
    vllm = support_mask(z, SamplingTruncation(top_p=0.75, min_p=0.3, engine="vllm"))
    assert generate.tolist() == [[True, True, True, False]] and vllm.tolist() == [[True, True, False, False]]
    assert sampling_truncation(0, 0.75, 0.3, engine="vllm").engine == "vllm"
    with pytest.raises(ValueError, match="engine"):
        SamplingTruncation(engine="sglang")
    torch.manual_seed(1)
    z = torch.randn(200, 30) * 2.0
    truncation = SamplingTruncation(top_k=12, top_p=0.8, min_p=0.08, engine="vllm")
    mask = support_mask(z, truncation)
    for row, kept in zip(z.double().softmax(-1).tolist(), mask.tolist(), strict=True):
        assert {j for j, keep in enumerate(kept) if keep} == _vllm_support(row, 12, 0.8, 0.08)


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference: each position's distribution as a Python list
# ---------------------------------------------------------------------------------------------------------------------


def _support(z: list[float], truncation: SamplingTruncation, sampled: int) -> set[int]:
    """The nucleus as usually stated: the most likely tokens, in order, while the mass before each is < top_p."""
    kept = set(range(len(z)))
    if truncation.top_k:
        kth = sorted(z, reverse=True)[truncation.top_k - 1]
        kept = {j for j in kept if z[j] >= kth}
    if truncation.top_p < 1:
        total = sum(math.exp(z[j]) for j in kept)
        before, nucleus = 0.0, set()
        for j in sorted(kept, key=lambda j: -z[j]):
            if before < truncation.top_p:
                nucleus.add(j)
            before += math.exp(z[j]) / total
        kept = nucleus
    if truncation.min_p:
        top = max(math.exp(z[j]) for j in kept)
        kept = {j for j in kept if math.exp(z[j]) >= truncation.min_p * top}
    return kept | {sampled}


def _reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float, truncation: SamplingTruncation):
    """``log pi_S(y)`` per position and its gradient in the logits, from the formula
    ``d/dz_j = [j == y] - [j in S] p_S(j)``, divided by the temperature."""
    batch, length, vocab = logits.shape
    values = torch.zeros(batch, length, dtype=torch.float64)
    grads = torch.zeros(batch, length, vocab, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            z = [x / temperature for x in logits[b, t].double().tolist()]
            y = int(ids[b, t])
            support = _support(z, truncation, y)
            normaliser = sum(math.exp(z[j]) for j in support)
            values[b, t] = z[y] - math.log(normaliser)
            for j in support:
                grads[b, t, j] = -math.exp(z[j]) / normaliser / temperature
            grads[b, t, y] += 1.0 / temperature
    return values, grads


TRUNCATIONS = [
    SamplingTruncation(top_k=5, top_p=0.9),
    SamplingTruncation(top_p=0.7),
    SamplingTruncation(min_p=0.1),
]


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["top_k+top_p", "top_p", "min_p"])
@pytest.mark.parametrize("chunk_size", [3, 64])
def test_chunked_truncated_log_probs_and_gradients_equal_the_formula(truncation, chunk_size):
    torch.manual_seed(1)
    logits = (torch.randn(2, 5, 17, dtype=torch.float64) * 2).requires_grad_()
    ids = torch.randint(0, 17, (2, 5))
    ids[0, 0] = logits[0, 0].argmin()  # a token outside every support: kept, finite
    weights = torch.randn(2, 5, dtype=torch.float64)
    want, want_grads = _reference(logits.detach(), ids, 0.7, truncation)
    logps, entropy, _ = chunked_logps(logits, ids, temperature=0.7, chunk_size=chunk_size, truncation=truncation)
    assert_close(logps, want, rtol=1e-10, atol=1e-12)
    (grad,) = torch.autograd.grad((logps * weights).sum(), logits)
    assert_close(grad, want_grads * weights.unsqueeze(-1), rtol=1e-10, atol=1e-12)
    assert torch.isfinite(entropy).all()
    # the entropy keeps TRL's meaning, the whole distribution's, whatever the truncation (the truncated one is several
    # times smaller: a run switching to a truncated ratio would otherwise change its entropy curve)
    _, full_entropy, _ = chunked_logps(logits, ids, temperature=0.7, chunk_size=chunk_size)
    torch.testing.assert_close(entropy, full_entropy)
    z = logits.double() / 0.7
    want = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(entropy.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=["top_k+top_p", "top_p", "min_p"])
def test_from_hidden_states_equals_from_logits_values_and_gradients(truncation):
    torch.manual_seed(2)
    hidden = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(23, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 23, (2, 6))
    weights = torch.randn(2, 6, dtype=torch.float64)
    logits = torch.nn.functional.linear(hidden, weight, bias) * 0.8
    want, _, _ = chunked_logps(logits, ids, temperature=1.3, truncation=truncation)
    want_grads = torch.autograd.grad((want * weights).sum(), (hidden, weight, bias))
    logps, _, _ = chunked_logps_from_hidden(
        hidden, weight, ids, temperature=1.3, lm_head_bias=bias, logit_scale=0.8, chunk_size=4, truncation=truncation
    )
    assert_close(logps, want, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad((logps * weights).sum(), (hidden, weight, bias))
    for got, expected in zip(grads, want_grads, strict=True):
        assert_close(got, expected, rtol=1e-9, atol=1e-11)


def test_without_truncation_the_chunked_log_probs_are_unchanged():
    torch.manual_seed(3)
    logits = torch.randn(2, 4, 11, dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 4))
    plain, plain_entropy, _ = chunked_logps(logits, ids, temperature=0.9)
    off, off_entropy, _ = chunked_logps(logits, ids, temperature=0.9, truncation=SamplingTruncation())
    assert torch.equal(plain, off) and torch.equal(plain_entropy, off_entropy)
    with pytest.raises(ValueError, match="topk_ids"):
        chunked_logps(logits, ids, ids.unsqueeze(-1), truncation=SamplingTruncation(top_p=0.5))
