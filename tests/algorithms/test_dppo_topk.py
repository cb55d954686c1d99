"""DPPO's top-K divergence (trl_reasoning/algorithms/logprobs.py, losses.topk_divergence) against docs/algorithms.md ("DPPO's divergence mask").

Hand-computed small cases, then an independent float64 reference (plain Python over full distributions), the chunked
log-prob functions against the unchunked formula (values and gradients), and a check that no op in the chunked paths
creates a ``[B, T, V]`` tensor beyond what the docstrings promise.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trl_reasoning.algorithms.logprobs import (
    chunked_logps,
    chunked_logps_from_hidden,
    rollout_topk,
    rollout_topk_from_hidden,
)
from trl_reasoning.algorithms.losses import (
    DPPO_DEFAULT_THRESHOLDS,
    compute_policy_loss,
    dppo_divergence_mask,
    topk_divergence,
)

TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference: full distributions as Python lists
# ---------------------------------------------------------------------------------------------------------------------


def softmax_list(row, temperature=1.0):
    z = [x / temperature for x in row]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = math.fsum(e)
    return [x / s for x in e]


def reference_topk_set(mu, sampled, k):
    """Ids of the k largest mu (ties by id), the sampled id replacing the last one when absent."""
    k = min(k, len(mu))
    ids = sorted(range(len(mu)), key=lambda j: (-mu[j], j))[:k]
    if sampled not in ids:
        ids[-1] = sampled
    return ids


def reference_divergence(mu, pi, ids, kind):
    mu_k = [mu[j] for j in ids]
    pi_k = [pi[j] for j in ids]
    # The rest bucket holds the tokens outside ``ids`` (none when ``ids`` covers the vocabulary).
    outside = [j for j in range(len(mu)) if j not in ids]
    mu_rest = math.fsum(mu[j] for j in outside)
    pi_rest = math.fsum(pi[j] for j in outside)
    if kind == "tv":
        return 0.5 * (math.fsum(abs(a - b) for a, b in zip(mu_k, pi_k)) + abs(mu_rest - pi_rest))
    terms = [a * math.log(a / b) for a, b in zip(mu_k, pi_k) if a > 0]
    if mu_rest > 0:
        terms.append(mu_rest * math.log(mu_rest / pi_rest))
    return math.fsum(terms)


def random_case(seed, batch=3, length=5, vocab=11, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    rollout_logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * spread
    current_logits = rollout_logits + 0.7 * torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    sampled = torch.randint(0, vocab, (batch, length), generator=g)
    return rollout_logits, current_logits, sampled


def package_divergence(rollout_logits, current_logits, sampled, k, kind, temperature=1.0, mask=None, chunk_size=4):
    ids, mu_logps = rollout_topk(rollout_logits, sampled, k, temperature=temperature, chunk_size=chunk_size)
    _, _, pi_logps = chunked_logps(current_logits, sampled, ids, temperature=temperature, chunk_size=chunk_size)
    return ids, topk_divergence(mu_logps, pi_logps, kind, mask)


# ---------------------------------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------------------------------

MU = [0.5, 0.3, 0.2]
PI = [0.4, 0.4, 0.2]


@pytest.mark.parametrize(
    ("sampled", "k", "tv", "kl"),
    [
        # K = 1, sampled = top token 0: buckets mu (0.5 | 0.5), pi (0.4 | 0.6)
        (0, 1, 0.1, 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)),
        # K = 1, sampled 2 is not the top token: swapped in, buckets mu (0.2 | 0.8), pi (0.2 | 0.8)
        (2, 1, 0.0, 0.0),
        # K = 2, sampled 0: buckets {0, 1} | rest: mu (0.5, 0.3 | 0.2), pi (0.4, 0.4 | 0.2)
        (0, 2, 0.1, 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)),
        # K = 2, sampled 2 replaces id 1: buckets {0, 2} | rest: mu (0.5, 0.2 | 0.3), pi (0.4, 0.2 | 0.4)
        (2, 2, 0.1, 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)),
    ],
)
def test_hand_cases(sampled, k, tv, kl):
    rollout_logits, current_logits = torch.log(t64([[MU]])), torch.log(t64([[PI]]))
    s = torch.tensor([[sampled]])
    ids, d_tv = package_divergence(rollout_logits, current_logits, s, k, "tv")
    _, d_kl = package_divergence(rollout_logits, current_logits, s, k, "kl")
    assert sampled in ids.view(-1).tolist()
    assert_close(d_tv, t64([[tv]]), **TIGHT)
    assert_close(d_kl, t64([[kl]]), **TIGHT)


def test_rollout_topk_swaps_the_sampled_token_in_for_the_least_likely():
    logits = torch.log(t64([[[0.05, 0.4, 0.3, 0.2, 0.05]]]))
    ids, logps = rollout_topk(logits, torch.tensor([[4]]), k=3)
    assert ids.view(-1).tolist() == [1, 2, 4]
    assert_close(logps.exp(), t64([[[0.4, 0.3, 0.05]]]), **TIGHT)
    ids, _ = rollout_topk(logits, torch.tensor([[2]]), k=3)  # present: nothing swapped
    assert ids.view(-1).tolist() == [1, 2, 3]
    assert ids.dtype == torch.long


def test_rollout_topk_applies_the_temperature_like_trl():
    logits = t64([[[2.0, 1.0, 0.0]]])
    _, logps = rollout_topk(logits, torch.tensor([[0]]), k=3, temperature=0.5)
    assert_close(logps, torch.log_softmax(logits / 0.5, dim=-1), **TIGHT)


def test_k_is_clamped_to_the_vocabulary():
    rollout_logits, current_logits, sampled = random_case(0, vocab=6)
    ids, logps = rollout_topk(rollout_logits, sampled, k=50)
    assert ids.shape == (3, 5, 6)
    assert sorted(ids[0, 0].tolist()) == list(range(6))
    assert_close(logps.exp().sum(-1), torch.ones(3, 5, dtype=torch.float64), **TIGHT)


def test_argument_errors():
    logits = torch.zeros(1, 1, 3)
    with pytest.raises(ValueError, match="temperature"):
        rollout_topk(logits, torch.zeros(1, 1, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logps(logits, torch.zeros(1, 1, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="k must be"):
        rollout_topk(logits, torch.zeros(1, 1, dtype=torch.long), k=0)
    with pytest.raises(ValueError, match="tv, kl"):
        topk_divergence(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), "js")


# ---------------------------------------------------------------------------------------------------------------------
# Against the float64 reference on random distributions
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tv", "kl"])
@pytest.mark.parametrize("k", [1, 4, 10, 11, 30])
@pytest.mark.parametrize("seed", [0, 1])
def test_topk_divergence_matches_reference(kind, k, seed):
    rollout_logits, current_logits, sampled = random_case(seed)
    temperature = 0.8
    ids, div = package_divergence(rollout_logits, current_logits, sampled, k, kind, temperature=temperature)
    for b in range(3):
        for t in range(5):
            mu = softmax_list(rollout_logits[b, t].tolist(), temperature)
            pi = softmax_list(current_logits[b, t].tolist(), temperature)
            ref_ids = reference_topk_set(mu, int(sampled[b, t]), k)
            assert sorted(ids[b, t].tolist()) == sorted(ref_ids)
            assert div[b, t].item() == pytest.approx(reference_divergence(mu, pi, ref_ids, kind), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_full_vocabulary_gives_the_exact_divergence(kind):
    rollout_logits, current_logits, sampled = random_case(3)
    _, div = package_divergence(rollout_logits, current_logits, sampled, 11, kind)
    mu, pi = torch.softmax(rollout_logits, -1), torch.softmax(current_logits, -1)
    exact = 0.5 * (mu - pi).abs().sum(-1) if kind == "tv" else (mu * (mu.log() - pi.log())).sum(-1)
    assert_close(div, exact, **TIGHT)


def test_sampled_token_missing_from_the_topk_is_used():
    """A low-probability sampled token enters the top-K set, so the divergence sees its change."""
    rollout_logits, current_logits, _ = random_case(4, batch=1, length=1, vocab=8, spread=0.0)
    rollout_logits[..., :] = torch.log(t64([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.01]))
    current_logits = rollout_logits.clone()
    current_logits[..., 7] += 3.0  # the sampled tail token gains mass
    ids, div = package_divergence(rollout_logits, current_logits, torch.tensor([[7]]), 3, "tv")
    assert ids.view(-1).tolist() == [0, 1, 7]
    mu = softmax_list(rollout_logits[0, 0].tolist())
    pi = softmax_list(current_logits[0, 0].tolist())
    assert div.item() == pytest.approx(reference_divergence(mu, pi, [0, 1, 7], "tv"), rel=1e-12)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_padding_and_unscored_positions_give_zero_without_nan(kind):
    rollout_logits, current_logits, sampled = random_case(5)
    ids, mu_logps = rollout_topk(rollout_logits, sampled, 4)
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    mu_logps[0, 3:] = float("-inf")  # padding garbage
    mu_logps[1, 2, 0] = float("nan")  # the engine could not score this position
    pi_logps = chunked_logps(current_logits.requires_grad_(True), sampled, ids)[2]
    pi_logps = torch.where(mask.bool().unsqueeze(-1), pi_logps, torch.full_like(pi_logps, float("nan")))
    div = topk_divergence(mu_logps, pi_logps, kind, mask)
    assert torch.isfinite(div).all()
    assert (div[0, 3:] == 0).all() and div[1, 2] == 0
    (grad,) = torch.autograd.grad(div.sum(), current_logits)
    assert torch.isfinite(grad).all()
    assert (grad[0, 3:] == 0).all() and (grad[1, 2] == 0).all()


def test_kl_is_finite_when_rest_vanishes_or_pi_underflows():
    # mu's top-2 hold all the mass (rest = 0 up to rounding); pi puts ~0 on one tracked token.
    mu = torch.log(t64([[[0.6, 0.4]]]))
    pi = t64([[[0.0, -800.0]]])  # exp(-800) underflows to 0 in float64
    div = topk_divergence(mu, pi, "kl")
    assert torch.isfinite(div).all() and div.item() > 100
    assert topk_divergence(mu, mu, "kl").item() == pytest.approx(0.0, abs=1e-15)
    assert topk_divergence(mu, mu, "tv").item() == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_divergence_gradient_matches_the_reference_formula(kind):
    """d D / d current_topk_logps against autograd through an explicit float64 formula (1 - sum, plain logs)."""
    rollout_logits, current_logits, sampled = random_case(6)
    ids, mu_logps = rollout_topk(rollout_logits, sampled, 4)
    pi_logps = chunked_logps(current_logits, sampled, ids)[2].detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(topk_divergence(mu_logps, pi_logps, kind).sum(), pi_logps)
    pi_ref = pi_logps.detach().clone().requires_grad_(True)
    mu_k, pi_k = mu_logps.exp(), pi_ref.exp()
    mu_r, pi_r = 1 - mu_k.sum(-1), 1 - pi_k.sum(-1)
    if kind == "tv":
        ref = 0.5 * ((mu_k - pi_k).abs().sum(-1) + (mu_r - pi_r).abs())
    else:
        ref = (mu_k * (mu_k.log() - pi_k.log())).sum(-1) + mu_r * (mu_r.log() - pi_r.log())
    (grad_ref,) = torch.autograd.grad(ref.sum(), pi_ref)
    assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Chunked log-probs equal the unchunked formula
# ---------------------------------------------------------------------------------------------------------------------


def unchunked(logits, sampled, topk_ids, temperature):
    logp = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, sampled.unsqueeze(-1)).squeeze(-1), entropy, logp.gather(-1, topk_ids)


@pytest.mark.parametrize("chunk_size", [1, 3, 5, 7, 15, 1000])
def test_chunked_logps_values_and_gradients(chunk_size):
    rollout_logits, current_logits, sampled = random_case(7)
    temperature = 0.7
    ids, _ = rollout_topk(rollout_logits, sampled, 4, temperature=temperature, chunk_size=chunk_size)
    g = torch.Generator().manual_seed(1)
    w_s, w_k = (
        torch.randn(3, 5, generator=g, dtype=torch.float64),
        torch.randn(3, 5, 4, generator=g, dtype=torch.float64),
    )

    x = current_logits.clone().requires_grad_(True)
    logps, entropy, topk = chunked_logps(x, sampled, ids, temperature=temperature, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad((logps * w_s).sum() + (topk * w_k).sum(), x)

    x_ref = current_logits.clone().requires_grad_(True)
    logps_ref, entropy_ref, topk_ref = unchunked(x_ref, sampled, ids, temperature)
    (grad_ref,) = torch.autograd.grad((logps_ref * w_s).sum() + (topk_ref * w_k).sum(), x_ref)

    assert_close(logps, logps_ref, **TIGHT)
    assert_close(entropy, entropy_ref, **TIGHT)
    assert_close(topk, topk_ref, **TIGHT)
    assert_close(grad, grad_ref, **TIGHT)
    assert not entropy.requires_grad


def test_chunked_logps_without_topk_and_with_low_precision_logits():
    _, current_logits, sampled = random_case(8)
    logps, entropy, topk = chunked_logps(current_logits.to(torch.bfloat16), sampled, chunk_size=4)
    assert topk is None and logps.dtype == torch.float32
    ref, ref_entropy, _ = unchunked(current_logits.to(torch.bfloat16).double(), sampled, sampled.unsqueeze(-1), 1.0)
    assert_close(logps.double(), ref, rtol=1e-5, atol=1e-5)
    assert_close(entropy.double(), ref_entropy, rtol=1e-5, atol=1e-5)


def test_only_the_topk_logps_need_the_graph():
    """A backward through topk_logps alone (sampled logps unused) still gives the right gradient."""
    rollout_logits, current_logits, sampled = random_case(9)
    ids, _ = rollout_topk(rollout_logits, sampled, 3)
    x = current_logits.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(chunked_logps(x, sampled, ids, chunk_size=2)[2].sum(), x)
    x_ref = current_logits.clone().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(unchunked(x_ref, sampled, ids, 1.0)[2].sum(), x_ref)
    assert_close(grad, grad_ref, **TIGHT)


@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("chunk_size", [2, 5, 64])
def test_from_hidden_equals_explicit_logits(softcap, chunk_size):
    g = torch.Generator().manual_seed(10)
    batch, length, hidden, vocab = 2, 5, 6, 13
    h = torch.randn(batch, length, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    b = torch.randn(vocab, generator=g, dtype=torch.float64)
    sampled = torch.randint(0, vocab, (batch, length), generator=g)
    temperature, scale = 0.9, 0.5
    kw = {"temperature": temperature, "logit_scale": scale, "final_logit_softcapping": softcap}

    def explicit_logits(h, w, b):
        y = (h @ w.T + b) * scale
        return y if softcap is None else softcap * torch.tanh(y / softcap)

    ids, mu = rollout_topk_from_hidden(h, w, sampled, 4, lm_head_bias=b, chunk_size=chunk_size, **kw)
    ids_ref, mu_ref = rollout_topk(explicit_logits(h, w, b), sampled, 4, temperature=temperature)
    assert torch.equal(ids, ids_ref)
    assert_close(mu, mu_ref, **TIGHT)

    weights = torch.randn(batch, length, 5, generator=g, dtype=torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in (h, w, b)]
    logps, entropy, topk = chunked_logps_from_hidden(
        leaves[0], leaves[1], sampled, ids, lm_head_bias=leaves[2], chunk_size=chunk_size, **kw
    )
    grads = torch.autograd.grad((torch.cat([logps.unsqueeze(-1), topk], -1) * weights).sum(), leaves)

    leaves_ref = [x.clone().requires_grad_(True) for x in (h, w, b)]
    logps_ref, entropy_ref, topk_ref = unchunked(explicit_logits(*leaves_ref), sampled, ids, temperature)
    grads_ref = torch.autograd.grad((torch.cat([logps_ref.unsqueeze(-1), topk_ref], -1) * weights).sum(), leaves_ref)

    assert_close(logps, logps_ref, **TIGHT)
    assert_close(entropy, entropy_ref, **TIGHT)
    assert_close(topk, topk_ref, **TIGHT)
    for got, want in zip(grads, grads_ref):
        assert_close(got, want, **TIGHT)


# ---------------------------------------------------------------------------------------------------------------------
# Memory: no op creates a [B, T, V] tensor except the documented gradient
# ---------------------------------------------------------------------------------------------------------------------


class LargestOutputs(TorchDispatchMode):
    """Records the element count of every fresh tensor an op allocates (forward and backward).

    Outputs that share storage with an input (views, in-place results) allocate nothing and are skipped.
    """

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {x.untyped_storage().data_ptr() for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)}
        out = func(*args, **kwargs)
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(x.numel())
        return out


def test_chunked_paths_never_build_a_full_vocabulary_tensor():
    batch, length, hidden, vocab, chunk = 4, 16, 8, 512, 8
    full = batch * length * vocab
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(batch, length, vocab, generator=g, requires_grad=True)
    sampled = torch.randint(0, vocab, (batch, length), generator=g)

    frozen = logits.detach()
    with LargestOutputs() as rec:  # negative control: the recorder sees a full log_softmax
        torch.log_softmax(frozen, dim=-1)
    assert rec.sizes == [full]

    with LargestOutputs() as rec:
        ids, _ = rollout_topk(frozen, sampled, 20, chunk_size=chunk)
    assert max(rec.sizes) <= chunk * vocab

    with LargestOutputs() as rec:
        logps, _, topk = chunked_logps(logits, sampled, ids, temperature=0.7, chunk_size=chunk)
        (logps.sum() + topk.sum()).backward()
    big = [n for n in rec.sizes if n > chunk * vocab]
    assert big == [full]  # only the gradient of the logits

    h = torch.randn(batch, length, hidden, generator=g, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, requires_grad=True)
    with LargestOutputs() as rec:
        logps, _, topk = chunked_logps_from_hidden(h, w, sampled, ids, temperature=0.7, chunk_size=chunk)
        (logps.sum() + topk.sum()).backward()
    assert max(rec.sizes) <= max(chunk * vocab, vocab * hidden)


# ---------------------------------------------------------------------------------------------------------------------
# DPPO with the top-K divergences
# ---------------------------------------------------------------------------------------------------------------------


def test_topk_thresholds_are_registered():
    assert DPPO_DEFAULT_THRESHOLDS["topk_tv"] == 0.15
    assert DPPO_DEFAULT_THRESHOLDS["topk_kl"] == 0.05


@pytest.mark.parametrize("divergence", ["topk_tv", "topk_kl"])
def test_topk_divergence_without_its_inputs_names_what_is_missing(divergence):
    args = (torch.log(t64([[0.5]])), torch.log(t64([[0.5]])), t64([1.0]), t64([[1.0]]))
    with pytest.raises(ValueError, match="rollout_topk_logps and topk_logps"):
        compute_policy_loss("dppo", *args, divergence=divergence)
    with pytest.raises(ValueError, match="needs topk_logps"):
        compute_policy_loss("dppo", *args, divergence=divergence, rollout_topk_logps=torch.zeros(1, 1, 2))


def test_topk_mask_blocks_a_shift_the_sampled_token_alone_does_not_show():
    """The sampled token barely moves (binary TV 0.05) but mass moves between other top-K tokens (top-K TV 0.25)."""
    mu = [0.5, 0.3, 0.2]
    pi = [0.55, 0.05, 0.4]
    logps, rollout = torch.log(t64([[0.55]])), torch.log(t64([[0.5]]))
    mu_topk, pi_topk = torch.log(t64([[mu]])), torch.log(t64([[pi]]))
    adv = t64([[1.0]])
    keep_binary, d_binary = dppo_divergence_mask(logps, rollout, adv, "binary_tv")
    keep_topk, d_topk = dppo_divergence_mask(
        logps, rollout, adv, "topk_tv", rollout_topk_logps=mu_topk, topk_logps=pi_topk
    )
    assert_close(d_binary, t64([[0.05]]), **TIGHT)
    assert_close(d_topk, t64([[0.25]]), **TIGHT)
    assert keep_binary.item() == 1 and keep_topk.item() == 0
    # The direction rule still applies: A < 0 with pi > mu is never blocked.
    keep_neg, _ = dppo_divergence_mask(logps, rollout, -adv, "topk_tv", rollout_topk_logps=mu_topk, topk_logps=pi_topk)
    assert keep_neg.item() == 1


@pytest.mark.parametrize("divergence", ["topk_tv", "topk_kl"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dppo_topk_loss_and_gradient_closed_form(divergence, seed):
    """End to end from logits: l = -A * sg(min(pi/mu, C)) * M * log pi, M from the reference top-K divergence."""
    rollout_logits, current_logits, sampled = random_case(seed, vocab=9, spread=1.5)
    current_logits = rollout_logits + 0.6 * (current_logits - rollout_logits)
    g = torch.Generator().manual_seed(seed + 100)
    advantages = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    mask[2, 4] = 0
    ids, mu_topk = rollout_topk(rollout_logits, sampled, 4)
    rollout_logps = chunked_logps(rollout_logits, sampled)[0]
    x = current_logits.clone().requires_grad_(True)
    logps, _, topk_logps = chunked_logps(x, sampled, ids, chunk_size=3)
    stats = {}
    per_token = compute_policy_loss(
        "dppo",
        logps,
        rollout_logps,
        advantages,
        mask,
        rollout_logps=rollout_logps,
        divergence=divergence,
        rollout_topk_logps=mu_topk,
        topk_logps=topk_logps,
        stats=stats,
    )
    assert set(stats) == {"dppo/masked_frac_pos_adv", "dppo/masked_frac_neg_adv", "dppo/divergence_mean"}
    (grad_logps,) = torch.autograd.grad((per_token * mask).sum(), logps, retain_graph=True)

    delta = DPPO_DEFAULT_THRESHOLDS[divergence]
    kind = divergence.removeprefix("topk_")
    for b in range(3):
        a = advantages[b].item()
        for t in range(5):
            mu = softmax_list(rollout_logits[b, t].tolist())
            pi = softmax_list(current_logits[b, t].tolist())
            s = int(sampled[b, t])
            d = reference_divergence(mu, pi, reference_topk_set(mu, s, 4), kind) if mask[b, t] else 0.0
            assert stats["dppo/divergence_mean"][b, t].item() == pytest.approx(d, rel=1e-9, abs=1e-12)
            blocked = (a > 0 and pi[s] > mu[s] and d > delta) or (a < 0 and pi[s] < mu[s] and d > delta)
            w = min(pi[s] / mu[s], 20.0)
            expected = 0.0 if blocked else -a * w * math.log(pi[s])
            assert per_token[b, t].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
            expected_grad = 0.0 if (blocked or not mask[b, t]) else -a * w
            assert grad_logps[b, t].item() == pytest.approx(expected_grad, rel=1e-9, abs=1e-12)
    # The top-K log-probs only feed the mask: no gradient reaches the logits through them.
    (grad_x,) = torch.autograd.grad((per_token * mask).sum(), x)
    x_ref = current_logits.clone().requires_grad_(True)
    logps_ref = torch.log_softmax(x_ref, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    (grad_ref,) = torch.autograd.grad((logps_ref * grad_logps).sum(), x_ref)
    assert_close(grad_x, grad_ref, **TIGHT)
