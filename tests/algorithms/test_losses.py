"""Per-token policy objectives (trl_reasoning/algorithms/losses.py) against docs/algorithms.md ("Per-token policy objectives").

Hand-computed small cases first, then an independent float64 reference (plain loops over 0-dim tensors), compared on
values and on gradients w.r.t. ``logps`` of the weighted sum ``sum_i w_i sum_t l_it m_it``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trl_reasoning.algorithms.aggregation import aggregate_loss
from trl_reasoning.algorithms.losses import POLICY_LOSSES, compute_policy_loss, dppo_divergence_mask

LOSSES = ("clip", "cispo", "dppo", "sequence_clip", "gspo", "sapo", "vespo")
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def logs(values):
    return torch.log(t64(values))


def loss_and_grad(name, logps, old_logps, advantages, mask, **kwargs):
    """The package's per-token loss and d(sum_t l_t m_t)/d logps."""
    logps = logps.clone().requires_grad_(True)
    per_token = compute_policy_loss(name, logps, old_logps, advantages, mask, **kwargs)
    (grad,) = torch.autograd.grad((per_token * mask).sum(), logps)
    return per_token.detach(), grad


# ---------------------------------------------------------------------------------------------------------------------
# clip
# ---------------------------------------------------------------------------------------------------------------------

# (rho, A, l = -min(rho*A, clip(rho, 0.8, 1.2)*A), dl/dlog pi) with eps_low = eps_high = 0.2
CLIP_CASES = [
    (1.5, 1.0, -1.2, 0.0),  # above 1 + eps, A > 0: clipped to 1.2, no gradient
    (1.5, -1.0, 1.5, 1.5),  # above, A < 0: min(-1.5, -1.2) = -1.5 keeps the ratio, gradient -A*rho = 1.5
    (1.2, 1.0, -1.2, None),  # at 1 + eps: both branches equal 1.2 (gradient at the kink not checked)
    (1.2, -1.0, 1.2, None),
    (1.0, 2.0, -2.0, -2.0),  # inside: -rho*A = -2, gradient -A*rho = -2
    (1.0, -2.0, 2.0, 2.0),
    (0.8, 1.0, -0.8, None),  # at 1 - eps
    (0.8, -1.0, 0.8, None),
    (0.5, 1.0, -0.5, -0.5),  # below 1 - eps, A > 0: min(0.5, 0.8) = 0.5 keeps the ratio, gradient -0.5
    (0.5, -1.0, 0.8, 0.0),  # below, A < 0: min(-0.5, -0.8) = -0.8 clipped, no gradient
]


@pytest.mark.parametrize(("rho", "adv", "loss", "grad"), CLIP_CASES)
def test_clip_hand_cases(rho, adv, loss, grad):
    out, g = loss_and_grad("clip", logs([[rho * 0.5]]), logs([[0.5]]), t64([adv]), t64([[1.0]]))
    assert_close(out, t64([[loss]]), rtol=1e-12, atol=1e-12)
    if grad is not None:
        assert_close(g, t64([[grad]]), rtol=1e-12, atol=1e-12)


def test_clip_higher_uses_asymmetric_range():
    # DAPO: eps_low = 0.2, eps_high = 0.28. A = 1: rho = 1.25 is inside (-1.25); rho = 1.3 is clipped to 1.28.
    # A = -1: rho = 0.75 is clipped to 0.8 (+0.8); rho = 0.85 is inside (+0.85).
    out = compute_policy_loss(
        "clip",
        logs([[1.25, 1.3, 0.75, 0.85]]).T,
        t64([[0.0]] * 4),
        t64([1.0, 1.0, -1.0, -1.0]),
        t64([[1.0]] * 4),
        epsilon_low=0.2,
        epsilon_high=0.28,
    )
    assert_close(out, t64([[-1.25], [-1.28], [0.8], [0.85]]), rtol=1e-12, atol=1e-12)


def test_clip_delta_caps_the_ratio_from_above():
    # delta = 1.4. rho = 2, A = -1: min(-1.4, -1.2) = -1.4 -> l = 1.4 (2.0 without delta).
    # rho = 2, A = +1: min(1.4, 1.2) -> l = -1.2, delta irrelevant. rho = 1.3 < delta, A = -1: l = 1.3 unchanged.
    args = (logs([[2.0], [2.0], [1.3]]), t64([[0.0]] * 3), t64([-1.0, 1.0, -1.0]), t64([[1.0]] * 3))
    assert_close(compute_policy_loss("clip", *args, delta=1.4), t64([[1.4], [-1.2], [1.3]]), rtol=1e-12, atol=1e-12)
    assert_close(compute_policy_loss("clip", *args), t64([[2.0], [-1.2], [1.3]]), rtol=1e-12, atol=1e-12)


def test_clip_stats_flag_the_clipped_tokens():
    # high: rho > 1 + eps with A > 0; low: rho < 1 - eps with A < 0. Other combinations are not clipped.
    stats = {}
    compute_policy_loss(
        "clip",
        logs([[1.5, 0.5, 1.5, 0.5, 1.0]]).T,
        t64([[0.0]] * 5),
        t64([1.0, 1.0, -1.0, -1.0, 1.0]),
        t64([[1.0]] * 5),
        stats=stats,
    )
    assert stats["clip_ratio/high_mean"].view(-1).tolist() == [True, False, False, False, False]
    assert stats["clip_ratio/low_mean"].view(-1).tolist() == [False, False, False, True, False]


# ---------------------------------------------------------------------------------------------------------------------
# cispo
# ---------------------------------------------------------------------------------------------------------------------


def test_cispo_cap_inactive():
    # pi = 0.5, pi_old = 0.25: rho = 2 < c = 5. l = -2 * A * log(0.5) = -2 * 1 * (-0.69314718) = 1.38629436.
    # Gradient: -sg(w) * A = -2 (the weight has no gradient).
    out, g = loss_and_grad("cispo", logs([[0.5]]), logs([[0.25]]), t64([1.0]), t64([[1.0]]))
    assert_close(out, t64([[1.3862943611198906]]), **TIGHT)
    assert_close(g, t64([[-2.0]]), **TIGHT)


def test_cispo_cap_active():
    # pi = 0.6, pi_old = 0.06: rho = 10 > c = 5 -> w = 5. A = -0.5: l = -5 * (-0.5) * log(0.6) = -1.27706406.
    # Gradient still flows (only the weight is capped): -5 * (-0.5) = 2.5.
    stats = {}
    out, g = loss_and_grad("cispo", logs([[0.6]]), logs([[0.06]]), t64([-0.5]), t64([[1.0]]), stats=stats)
    assert_close(out, t64([[-1.2770640594149767]]), **TIGHT)
    assert_close(g, t64([[2.5]]), **TIGHT)
    assert not stats["clip_ratio/high_mean"].any()  # A < 0: not counted as a high clip


def test_cispo_epsilon_high_is_an_absolute_cap():
    # c = 1.5 caps rho = 2 at 1.5 (not at 1 + 1.5 = 2.5): l = -1.5 * 1 * log(0.5) = 1.03972077, gradient -1.5.
    stats = {}
    out, g = loss_and_grad(
        "cispo", logs([[0.5]]), logs([[0.25]]), t64([1.0]), t64([[1.0]]), epsilon_high=1.5, stats=stats
    )
    assert_close(out, t64([[1.0397207708399179]]), **TIGHT)
    assert_close(g, t64([[-1.5]]), **TIGHT)
    assert stats["clip_ratio/high_mean"].all()


# ---------------------------------------------------------------------------------------------------------------------
# dppo
# ---------------------------------------------------------------------------------------------------------------------

# (pi, mu, A, blocked) outside the trust region for both divergences: |0.9 - 0.5| = 0.4 > 0.15,
# KL(0.5 || 0.9) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 ln(25/9) = ln(5/3) = 0.51082562 > 0.05 (same for pi = 0.1).
MASK_CASES = [
    (0.9, 0.5, 1.0, True),  # A > 0 and pi > mu: pushing further up past the region -> blocked
    (0.1, 0.5, 1.0, False),  # A > 0 and pi < mu: the update moves back toward mu -> kept
    (0.1, 0.5, -1.0, True),  # A < 0 and pi < mu: pushing further down -> blocked
    (0.9, 0.5, -1.0, False),  # A < 0 and pi > mu -> kept
    (0.9, 0.5, 0.0, False),  # A = 0 is never blocked
]


@pytest.mark.parametrize("divergence", ["binary_tv", "binary_kl"])
@pytest.mark.parametrize(("pi", "mu", "adv", "blocked"), MASK_CASES)
def test_dppo_mask_outside_trust_region(divergence, pi, mu, adv, blocked):
    keep, div = dppo_divergence_mask(logs([[pi]]), logs([[mu]]), t64([[adv]]), divergence)
    expected_div = 0.4 if divergence == "binary_tv" else math.log(5 / 3)
    assert_close(div, t64([[expected_div]]), rtol=1e-12, atol=1e-12)
    assert keep.item() == (0.0 if blocked else 1.0)
    assert not keep.requires_grad


@pytest.mark.parametrize("divergence", ["binary_tv", "binary_kl"])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_dppo_mask_inside_trust_region_keeps_every_direction(divergence, adv):
    # pi = 0.55 / 0.45 vs mu = 0.5: TV = 0.05 < 0.15; KL = 0.5 ln(0.5/0.55) + 0.5 ln(0.5/0.45) = 0.00502517 < 0.05.
    keep, div = dppo_divergence_mask(logs([[0.55], [0.45]]), logs([[0.5], [0.5]]), t64([[adv], [adv]]), divergence)
    expected_div = 0.05 if divergence == "binary_tv" else 0.005025167926750729
    assert_close(div, t64([[expected_div]] * 2), rtol=1e-9, atol=1e-12)
    assert keep.tolist() == [[1.0], [1.0]]


@pytest.mark.parametrize("divergence", ["binary_tv", "binary_kl"])
def test_dppo_threshold_exactly_at_divergence_does_not_block(divergence):
    # The mask blocks only for D > delta (strict): delta = D keeps the token, the next float below D blocks it.
    logps, rollout, adv = logs([[0.9]]), logs([[0.5]]), t64([[1.0]])
    _, div = dppo_divergence_mask(logps, rollout, adv, divergence)
    d = div.item()
    keep_at, _ = dppo_divergence_mask(logps, rollout, adv, divergence, threshold=d)
    keep_below, _ = dppo_divergence_mask(logps, rollout, adv, divergence, threshold=math.nextafter(d, 0.0))
    assert keep_at.item() == 1.0
    assert keep_below.item() == 0.0


def test_dppo_default_thresholds():
    # binary_tv default 0.15: D = 0.14 kept, D = 0.16 blocked. binary_kl default 0.05:
    # pi = 0.6, mu = 0.5: KL = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.02041 kept; pi = 0.7: 0.08718 blocked.
    adv = t64([[1.0], [1.0]])
    keep, _ = dppo_divergence_mask(logs([[0.64], [0.66]]), logs([[0.5], [0.5]]), adv, "binary_tv")
    assert keep.tolist() == [[1.0], [0.0]]
    keep, _ = dppo_divergence_mask(logs([[0.6], [0.7]]), logs([[0.5], [0.5]]), adv, "binary_kl")
    assert keep.tolist() == [[1.0], [0.0]]


def test_dppo_loss_hand_cases():
    # binary_tv, delta = 0.15, no cap (the default); l = -A * (pi/mu) * M * log pi, gradient -A * (pi/mu) * M.
    # row 0: pi 0.6, mu 0.3, A = +1: D 0.3, pi > mu -> blocked, l = 0, gradient 0.
    # row 1: pi 0.6, mu 0.3, A = -1: kept, w = 2 -> l = 2 * log(0.6) = -1.02165125, gradient 2.
    # row 2: pi 0.3, mu 0.6, A = +1: kept, w = 0.5 -> l = -0.5 * log(0.3) = 0.60198640, gradient -0.5.
    # row 3: pi 0.9, mu 0.01, A = -1: kept (pi > mu, A < 0), w = 90 -> l = 90 log(0.9) = -9.48244641.
    logps = logs([[0.6], [0.6], [0.3], [0.9]])
    rollout = logs([[0.3], [0.3], [0.6], [0.01]])
    old = logs([[0.5]] * 4)  # pi_old differs from mu_roll: dppo must use the rollout probabilities
    stats = {}
    out, g = loss_and_grad(
        "dppo", logps, old, t64([1.0, -1.0, 1.0, -1.0]), t64([[1.0]] * 4), rollout_logps=rollout, stats=stats
    )
    assert_close(out, t64([[0.0], [-1.0216512475319814], [0.6019864021629681], [90 * math.log(0.9)]]), **TIGHT)
    assert_close(out[3], t64([-9.482446409]), rtol=0, atol=1e-9)
    assert_close(g, t64([[0.0], [2.0], [-0.5], [90.0]]), **TIGHT)
    assert stats["dppo/masked_frac_pos_adv"].view(-1).tolist() == [True, False, False, False]
    assert not stats["dppo/masked_frac_neg_adv"].any()
    # is_cap = 5 caps row 3's weight at 5: l = 5 log(0.9) = -0.52680258
    out = compute_policy_loss(
        "dppo", logps, old, t64([1.0, -1.0, 1.0, -1.0]), t64([[1.0]] * 4), rollout_logps=rollout, is_cap=5.0
    )
    assert_close(out[3], t64([5 * math.log(0.9)]), **TIGHT)


def test_dppo_falls_back_to_old_logps_without_rollout_logps():
    # Without rollout_logps (or where they are NaN), mu_roll = pi_old.
    logps, old = logs([[0.6, 0.3]]), logs([[0.3, 0.6]])
    args = (t64([-1.0]), t64([[1.0, 1.0]]))
    expected = compute_policy_loss("dppo", logps, old, *args, rollout_logps=old)
    assert_close(compute_policy_loss("dppo", logps, old, *args), expected, **TIGHT)
    partial = torch.tensor([[float("nan"), math.log(0.6)]], dtype=torch.float64)
    assert_close(compute_policy_loss("dppo", logps, old, *args, rollout_logps=partial), expected, **TIGHT)


def test_dppo_unknown_divergence_lists_the_allowed_names():
    with pytest.raises(ValueError, match="binary_tv, binary_kl"):
        compute_policy_loss("dppo", logs([[0.5]]), logs([[0.5]]), t64([1.0]), t64([[1.0]]), divergence="tv")


# ---------------------------------------------------------------------------------------------------------------------
# sequence_clip and gspo
# ---------------------------------------------------------------------------------------------------------------------


def test_sequence_clip_spreads_the_sequence_loss_over_its_tokens():
    # Row 0, mask [1, 1, 0], log-ratios [0.1, 0.2, 5.0 (padding, ignored)]: rho_s = exp(0.3) = 1.34985881 > 1.2.
    #   A = +1: l = -min(1.3499, 1.2) = -1.2, spread over 2 tokens -> [-0.6, -0.6, 0].
    # Row 1, same tokens, A = -1: l = -min(-1.3499, -1.2) = 1.34985881 -> [0.67492940, 0.67492940, 0]; its gradient
    #   d l / d log pi_t = -A rho_s m_t = 1.34985881 on the 2 unmasked tokens.
    # Row 2, no unmasked token: all zero.
    old = t64([[0.0, 0.0, 0.0]] * 3)
    logps = t64([[0.1, 0.2, 5.0]] * 3)
    mask = t64([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    out, g = loss_and_grad("sequence_clip", logps, old, t64([1.0, -1.0, 1.0]), mask)
    r = math.exp(0.3)
    assert_close(out, t64([[-0.6, -0.6, 0.0], [r / 2, r / 2, 0.0], [0.0, 0.0, 0.0]]), **TIGHT)
    assert_close((out * mask).sum(dim=1), t64([-1.2, r, 0.0]), **TIGHT)  # masked row-sum == sequence loss
    assert_close(g, t64([[0.0, 0.0, 0.0], [r, r, 0.0], [0.0, 0.0, 0.0]]), **TIGHT)


def test_gspo_broadcasts_the_sequence_loss_to_every_token():
    # mask [1, 1, 0], log-ratios [0.1, 0.3, 9.0 (padding)]: s = exp((0.1 + 0.3) / 2) = exp(0.2) = 1.22140276 > 1.2.
    # A = +1: l = -1.2 on every token; A = -1: l = -min(-1.2214, -1.2) = 1.22140276 on every token, and the gradient
    # is -A * s / |y| = 1.22140276 / 2 per unmasked token (seq loss counted once per token: 2 * s / 2 = s in total).
    old = t64([[0.0, 0.0, 0.0]] * 2)
    logps = t64([[0.1, 0.3, 9.0]] * 2)
    mask = t64([[1, 1, 0], [1, 1, 0]])
    stats = {}
    out, g = loss_and_grad("gspo", logps, old, t64([1.0, -1.0]), mask, stats=stats)
    s = math.exp(0.2)
    assert out.shape == (2, 3)
    assert_close(out, t64([[-1.2] * 3, [s] * 3]), **TIGHT)
    assert_close(g, t64([[0.0, 0.0, 0.0], [s, s, 0.0]]), **TIGHT)
    assert stats["clip_ratio/high_mean"].tolist() == [[True], [False]]


# ---------------------------------------------------------------------------------------------------------------------
# sapo, vespo and the sequence-level ratio
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adv", [1.0, -2.0])
def test_sapo_on_policy_gate_and_gradient(adv):
    # rho = 1: gate = sigmoid(0) * 4 / tau = 2 / tau, so l = -2 A / tau; its gradient -A sigmoid'(0) tau (4 / tau) rho
    # = -A for either temperature (the gate matches the unclipped surrogate at rho = 1).
    tau = 1.0 if adv > 0 else 1.05
    out, g = loss_and_grad("sapo", logs([[0.3]]), logs([[0.3]]), t64([adv]), t64([[1.0]]))
    assert_close(out, t64([[-2 * adv / tau]]), **TIGHT)
    assert_close(g, t64([[-adv]]), **TIGHT)


def test_sapo_gate_fades_far_from_one_instead_of_cutting():
    # rho = 3, A = 1, tau = 1: gate = 4 sigmoid(2) = 3.52318831; gradient -A * rho * 4 sigmoid(2)(1 - sigmoid(2)),
    # small but not 0 (a hard clip gives exactly 0 here).
    sig = 1 / (1 + math.exp(-2.0))
    out, g = loss_and_grad("sapo", logs([[0.6]]), logs([[0.2]]), t64([1.0]), t64([[1.0]]))
    assert_close(out, t64([[-4 * sig]]), **TIGHT)
    assert_close(g, t64([[-3 * 4 * sig * (1 - sig)]]), **TIGHT)


def test_vespo_weight_is_one_on_policy_and_gamma_shaped_off_it():
    # On-policy w = 1: phi = e^lam * 1 * e^-lam = 1, so l = -A log pi (REINFORCE), gradient -A.
    out, g = loss_and_grad("vespo", logs([[0.5, 0.5]]), logs([[0.5, 0.5]]), t64([2.0]), t64([[1.0, 1.0]]))
    assert_close(out, t64([[-2.0 * math.log(0.5)] * 2]), **TIGHT)
    assert_close(g, t64([[-2.0, -2.0]]), **TIGHT)
    # w = rho_1 rho_2 = 2 * 1 = 2 with A > 0 (k = 2, lam = 3): phi = e^3 * 4 * e^-6 = 4 e^-3; gradient -phi * A.
    stats = {}
    out, g = loss_and_grad("vespo", logs([[0.8, 0.5]]), logs([[0.4, 0.5]]), t64([1.0]), t64([[1.0, 1.0]]), stats=stats)
    phi = 4 * math.exp(-3)
    assert_close(g, t64([[-phi, -phi]]), **TIGHT)
    assert_close(stats["vespo/phi_seq_mean"], t64([[phi]]), **TIGHT)
    # The rollout-mismatch ratio multiplies w: IS ratios (1, 0.5) halve it back to 1, so phi = 1.
    out, g = loss_and_grad(
        "vespo",
        logs([[0.8, 0.5]]),
        logs([[0.4, 0.5]]),
        t64([1.0]),
        t64([[1.0, 1.0]]),
        importance_sampling_ratio=t64([[1.0, 0.5]]),
    )
    assert_close(g, t64([[-1.0, -1.0]]), **TIGHT)


def test_sequence_level_ratio_is_the_exp_of_the_mean_log_ratio_over_the_mask():
    from trl_reasoning.algorithms.losses import importance_ratio

    # log-ratios (log 2, log 8, anything) with mask (1, 1, 0): exp((log 2 + log 8) / 2) = exp(log 4) = 4.
    ratio = importance_ratio(logs([[0.4, 0.8, 0.9]]), logs([[0.2, 0.1, 0.1]]), t64([[1, 1, 0]]), "sequence")
    assert ratio.shape == (1, 1)
    assert_close(ratio, t64([[4.0]]), **TIGHT)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        importance_ratio(logs([[0.4]]), logs([[0.2]]), t64([[1]]), "batch")


def test_sequence_ratio_with_per_token_advantages_takes_gspo_token_gradient():
    # GSPO §4.3 (GSPO-token): s_it = sg[s_i] * pi_t / sg[pi_t]. Log-ratios (0.1, -0.1, padding 5.0) give s_i = e^0 = 1,
    # inside any clip; advantages (2, -1, 7): l_t = -s_i A_t = (-2, 1, -7), and d(sum_t m_t l_t)/d log pi_t =
    # -s_i A_t m_t = (-2, 1, 0). Differentiating s_i itself would give -mean_t(A) * s_i / |y| = -0.25 on both tokens.
    logps, old, mask = t64([[0.1, -0.1, 5.0]]), t64([[0.0, 0.0, 0.0]]), t64([[1, 1, 0]])
    advantages = t64([[2.0, -1.0, 7.0]])
    for name, kwargs in (("gspo", {}), ("clip", {"importance_sampling_level": "sequence"})):
        out, g = loss_and_grad(name, logps, old, advantages, mask, **kwargs)
        assert_close(out, t64([[-2.0, 1.0, -7.0]]), **TIGHT)
        assert_close(g, t64([[-2.0, 1.0, 0.0]]), **TIGHT)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("gspo", {}),
        ("gspo", {"epsilon_low": 3e-4, "epsilon_high": 4e-4}),
        ("clip", {"importance_sampling_level": "sequence", "delta": 1.05}),
        ("sapo", {"importance_sampling_level": "sequence"}),
    ],
)
def test_gspo_token_matches_a_float64_reference_and_reduces_to_gspo(name, kwargs, seed):
    """Per-token advantages: values and gradients against GSPO-token's formula written out per token; advantages
    equal across a sequence's tokens give exactly the one-advantage-per-sequence loss (GSPO §4.3)."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 5, 6
    logps = torch.log(torch.rand(n, t, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    old = logps + 0.2 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.25).to(torch.float64)
    mask[:, 0] = 1.0
    advantages = torch.randn(n, t, generator=gen, dtype=torch.float64)
    out, g = loss_and_grad(name, logps, old, advantages, mask, **kwargs)
    expected_out, expected_g = torch.zeros(n, t, dtype=torch.float64), torch.zeros(n, t, dtype=torch.float64)
    low, high = kwargs.get("epsilon_low", 0.2), kwargs.get("epsilon_high", 0.2)
    for i in range(n):
        count = sum(mask[i].tolist())
        s = math.exp(sum((logps[i, k].item() - old[i, k].item()) * mask[i, k].item() for k in range(t)) / count)
        for k in range(t):
            a = advantages[i, k].item()
            if name == "sapo":
                tau = kwargs.get("sapo_temperature_pos", 1.0) if a > 0 else kwargs.get("sapo_temperature_neg", 1.05)
                sig = 1 / (1 + math.exp(-tau * (s - 1)))
                expected_out[i, k] = -sig * 4 / tau * a
                slope = 4 * sig * (1 - sig)  # d/ds of sigmoid(tau (s - 1)) * 4 / tau
            else:
                unclipped = s if kwargs.get("delta") is None else min(s, kwargs["delta"])
                clipped = min(max(s, 1 - low), 1 + high)
                expected_out[i, k] = -min(unclipped * a, clipped * a)
                # the minimum's gradient flows through whichever term it takes; clamped terms carry none
                takes_unclipped = unclipped * a <= clipped * a
                if takes_unclipped:
                    slope = 1.0 if kwargs.get("delta") is None or s < kwargs["delta"] else 0.0
                else:
                    slope = 1.0 if 1 - low < s < 1 + high else 0.0
            # d s_it / d log pi_t = s_i (only the token's own term carries a gradient)
            expected_g[i, k] = -slope * s * a * mask[i, k].item()
    assert_close(out, expected_out, rtol=1e-10, atol=1e-12)
    assert_close(g, expected_g, rtol=1e-9, atol=1e-12)
    # one advantage per sequence, as (N, T) or as (N,): the same loss and gradient
    per_sequence = advantages[:, 0]
    out_t, g_t = loss_and_grad(name, logps, old, per_sequence[:, None].expand(n, t).clone(), mask, **kwargs)
    out_s, g_s = loss_and_grad(name, logps, old, per_sequence, mask, **kwargs)
    assert_close(out_t, out_s.expand(n, t), rtol=1e-12, atol=1e-12)
    assert_close(g_t, g_s, rtol=1e-10, atol=1e-12)


def test_unknown_loss_lists_the_allowed_names():
    with pytest.raises(ValueError, match="Allowed values") as info:
        compute_policy_loss("ppo", logs([[0.5]]), logs([[0.5]]), t64([1.0]), t64([[1.0]]))
    for name in LOSSES:
        assert name in str(info.value)
    assert set(POLICY_LOSSES.names()) == set(LOSSES)


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference on random inputs
# ---------------------------------------------------------------------------------------------------------------------


def random_batch(seed):
    """A random (P*G, T) batch: probabilities in (0.05, 0.95), nearby pi_old / mu_roll, random masks with holes,
    a fully masked row, some NaN rollout log-probs and one zero advantage."""
    gen = torch.Generator().manual_seed(seed)
    num_prompts = int(torch.randint(2, 5, (1,), generator=gen))
    num_generations = int(torch.randint(2, 5, (1,), generator=gen))
    n, t = num_prompts * num_generations, int(torch.randint(5, 10, (1,), generator=gen))

    def nearby(p):
        return (p * torch.exp(0.35 * torch.randn(n, t, dtype=torch.float64, generator=gen))).clamp(0.01, 0.99)

    probs = 0.05 + 0.9 * torch.rand(n, t, dtype=torch.float64, generator=gen)
    old_probs, rollout_probs = nearby(probs), nearby(probs)
    lengths = torch.randint(2, t + 1, (n,), generator=gen)
    mask = (torch.arange(t) < lengths[:, None]) & (torch.rand(n, t, generator=gen) > 0.15)
    mask[0] = False  # a row without any unmasked token
    mask[-1, 0] = True
    rollout_logps = rollout_probs.log()
    rollout_logps[torch.rand(n, t, generator=gen) < 0.1] = float("nan")  # vLLM could not score these
    advantages = torch.randn(n, dtype=torch.float64, generator=gen)
    advantages[-1] = 0.0
    weights = torch.rand(n, dtype=torch.float64, generator=gen)  # any per-completion weights w_i
    return {
        "logps": probs.log(),
        "old_logps": old_probs.log(),
        "rollout_logps": rollout_logps,
        "advantages": advantages,
        "mask": mask.double(),
        "weights": weights,
    }


def reference_per_token_loss(name, logps, old_logps, advantages, mask, **kw):
    """docs/algorithms.md's formulas token by token. ``logps`` may require grad; stop-gradient terms are Python floats."""
    n, t = logps.shape
    old, adv, m = old_logps.tolist(), advantages.tolist(), mask.tolist()
    rows = []
    level = kw.get("importance_sampling_level", "token")
    for i in range(n):
        a = adv[i]
        count = sum(m[i])
        if name == "vespo":
            # phi(w) = e^lam w^k e^(-lam w), w = prod_t rho_t (each log-ratio clamped to [-20, 20]), log w clamped to
            # [log 1e-8, 20]; (k, lam) by the advantage's sign; a stop-gradient weight (a Python float).
            log_w = sum(min(max(logps[i, k].item() - old[i][k], -20.0), 20.0) * m[i][k] for k in range(t))
            log_w = min(max(log_w, math.log(1e-8)), 20.0)
            k_, lam = (kw.get("vespo_k_pos", 2.0), kw.get("vespo_lambda_pos", 3.0))
            if a < 0:
                k_, lam = (kw.get("vespo_k_neg", 3.0), kw.get("vespo_lambda_neg", 2.0))
            phi = math.exp(lam + k_ * log_w - lam * math.exp(log_w))
            rows.append([-phi * a * logps[i, k] for k in range(t)])
            continue
        if level == "sequence" and name in ("clip", "cispo", "sapo"):
            seq_log_ratio = sum(
                ((logps[i, k] - old[i][k]) * m[i][k] for k in range(t)), torch.zeros((), dtype=torch.float64)
            ) / max(count, 1)
            rho = torch.exp(seq_log_ratio)
            if name == "clip":
                clipped = torch.clamp(rho, 1 - kw.get("epsilon_low", 0.2), 1 + kw.get("epsilon_high", 0.2))
                unclipped = rho if kw.get("delta") is None else torch.clamp(rho, max=kw["delta"])
                rows.append([-torch.minimum(unclipped * a, clipped * a)] * t)
            elif name == "sapo":
                tau = kw.get("sapo_temperature_pos", 1.0) if a > 0 else kw.get("sapo_temperature_neg", 1.05)
                rows.append([-torch.sigmoid(tau * (rho - 1)) * 4 / tau * a] * t)
            else:
                w = min(rho.item(), kw.get("epsilon_high", 5.0))
                rows.append([-w * a * logps[i, k] for k in range(t)])
            continue
        if name in ("sequence_clip", "gspo"):
            log_ratio = sum(
                ((logps[i, k] - old[i][k]) * m[i][k] for k in range(t)), torch.zeros((), dtype=torch.float64)
            )
            if name == "gspo":
                log_ratio = log_ratio / max(count, 1)
            rho = torch.exp(log_ratio)
            clipped = torch.clamp(rho, 1 - kw.get("epsilon_low", 0.2), 1 + kw.get("epsilon_high", 0.2))
            unclipped = rho if kw.get("delta") is None else torch.clamp(rho, max=kw["delta"])
            seq_loss = -torch.minimum(unclipped * a, clipped * a)
            if name == "gspo":
                rows.append([seq_loss] * t)  # broadcast to every position
            else:
                rows.append([seq_loss / count * m[i][k] if count else seq_loss * 0.0 for k in range(t)])
            continue
        row = []
        for k in range(t):
            lp = logps[i, k]
            if name == "clip":
                rho = torch.exp(lp - old[i][k])
                clipped = torch.clamp(rho, 1 - kw.get("epsilon_low", 0.2), 1 + kw.get("epsilon_high", 0.2))
                unclipped = rho if kw.get("delta") is None else torch.clamp(rho, max=kw["delta"])
                row.append(-torch.minimum(unclipped * a, clipped * a))
            elif name == "cispo":
                w = min(math.exp(lp.item() - old[i][k]), kw.get("epsilon_high", 5.0))  # sg(min(rho, c))
                row.append(-w * a * lp)
            elif name == "sapo":
                rho = torch.exp(lp - old[i][k])
                tau = kw.get("sapo_temperature_pos", 1.0) if a > 0 else kw.get("sapo_temperature_neg", 1.05)
                row.append(-torch.sigmoid(tau * (rho - 1)) * 4 / tau * a)
            elif name == "dppo":
                mu_log = kw["rollout_logps"][i][k]
                mu_log = old[i][k] if math.isnan(mu_log) else mu_log
                pi, mu = math.exp(lp.item()), math.exp(mu_log)
                if kw.get("divergence", "binary_tv") == "binary_tv":
                    d, delta = abs(pi - mu), 0.15
                else:
                    d, delta = mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi)), 0.05
                delta = kw.get("threshold") or delta
                blocked = (a > 0 and pi > mu and d > delta) or (a < 0 and pi < mu and d > delta)
                cap = kw.get("is_cap")
                w = pi / mu if cap is None else min(pi / mu, cap)  # sg(min(pi / mu_roll, C)), no cap by default
                row.append(-a * w * (0.0 if blocked else 1.0) * lp)
        rows.append(row)
    return torch.stack([torch.stack(row) for row in rows])


LOSS_CONFIGS = [
    pytest.param("clip", {}, id="clip"),
    pytest.param("clip", {"epsilon_low": 0.2, "epsilon_high": 0.28}, id="clip-higher"),
    pytest.param("clip", {"epsilon_low": 0.1, "epsilon_high": 0.3, "delta": 1.25}, id="clip-delta"),
    pytest.param("cispo", {}, id="cispo"),
    pytest.param("cispo", {"epsilon_high": 1.1}, id="cispo-cap1.1"),
    pytest.param("dppo", {"divergence": "binary_tv"}, id="dppo-tv"),
    pytest.param("dppo", {"divergence": "binary_kl"}, id="dppo-kl"),
    pytest.param("dppo", {"divergence": "binary_tv", "threshold": 0.05, "is_cap": 1.5}, id="dppo-tv-custom"),
    pytest.param("sequence_clip", {}, id="sequence_clip"),
    pytest.param("sequence_clip", {"epsilon_low": 0.1, "epsilon_high": 0.3}, id="sequence_clip-asym"),
    pytest.param("gspo", {}, id="gspo"),
    pytest.param("gspo", {"epsilon_low": 0.05, "epsilon_high": 0.1}, id="gspo-narrow"),
    pytest.param("gspo", {"delta": 1.1}, id="gspo-delta"),
    pytest.param("clip", {"importance_sampling_level": "sequence"}, id="clip-sequence"),
    pytest.param("clip", {"importance_sampling_level": "sequence", "delta": 1.1}, id="clip-sequence-delta"),
    pytest.param("cispo", {"importance_sampling_level": "sequence", "epsilon_high": 1.05}, id="cispo-sequence"),
    pytest.param("sapo", {}, id="sapo"),
    pytest.param("sapo", {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5}, id="sapo-temperatures"),
    pytest.param("sapo", {"importance_sampling_level": "sequence"}, id="sapo-sequence"),
    pytest.param("vespo", {}, id="vespo"),
    pytest.param(
        "vespo",
        {"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 4.0, "vespo_lambda_neg": 5.0},
        id="vespo-custom",
    ),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("name", "kwargs"), LOSS_CONFIGS)
def test_matches_reference_values_and_gradients(name, kwargs, seed):
    b = random_batch(seed)
    kw = dict(kwargs)
    if name == "dppo":
        kw["rollout_logps"] = b["rollout_logps"]

    logps = b["logps"].clone().requires_grad_(True)
    per_token = compute_policy_loss(name, logps, b["old_logps"], b["advantages"], b["mask"], **kw)
    total = aggregate_loss(per_token, b["mask"], weights=b["weights"])
    (grad,) = torch.autograd.grad(total, logps)

    ref_logps = b["logps"].clone().requires_grad_(True)
    ref_kw = {**kw, "rollout_logps": b["rollout_logps"].tolist()} if name == "dppo" else kw
    ref = reference_per_token_loss(name, ref_logps, b["old_logps"], b["advantages"], b["mask"], **ref_kw)
    w, m = b["weights"].tolist(), b["mask"].tolist()
    ref_total = sum(w[i] * ref[i, k] * m[i][k] for i in range(len(m)) for k in range(len(m[0])))
    (ref_grad,) = torch.autograd.grad(ref_total, ref_logps)

    assert per_token.shape == b["logps"].shape and per_token.dtype == torch.float64
    if name == "sequence_clip":  # padding positions are zero; elsewhere compare everything
        assert_close(per_token.detach(), ref.detach(), **TIGHT)
    else:
        assert_close(per_token.detach() * b["mask"], ref.detach() * b["mask"], **TIGHT)
        assert torch.isfinite(per_token).all()
    assert_close(total.detach(), ref_total.detach(), **TIGHT)
    assert_close(grad, ref_grad, **TIGHT)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_gradient_closed_form(seed):
    # d/d log pi_t of sum_i w_i sum_t l_it m_it = -w_i * sg(min(rho_t, c)) * A_i * m_it
    b = random_batch(seed)
    logps = b["logps"].clone().requires_grad_(True)
    per_token = compute_policy_loss("cispo", logps, b["old_logps"], b["advantages"], b["mask"], epsilon_high=1.1)
    (grad,) = torch.autograd.grad(aggregate_loss(per_token, b["mask"], weights=b["weights"]), logps)
    ratio = torch.exp(b["logps"] - b["old_logps"]).clamp(max=1.1)
    expected = -b["weights"][:, None] * ratio * b["advantages"][:, None] * b["mask"]
    assert_close(grad, expected, **TIGHT)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dppo_gradient_closed_form(seed):
    # d/d log pi_t = -w_i * A_i * sg(min(pi/mu, C)) * M_t * m_it; the mask M and the weight carry no gradient.
    b = random_batch(seed)
    rollout = torch.where(torch.isnan(b["rollout_logps"]), b["old_logps"], b["rollout_logps"])
    logps = b["logps"].clone().requires_grad_(True)
    per_token = compute_policy_loss("dppo", logps, b["old_logps"], b["advantages"], b["mask"], rollout_logps=rollout)
    (grad,) = torch.autograd.grad(aggregate_loss(per_token, b["mask"], weights=b["weights"]), logps)
    keep, _ = dppo_divergence_mask(b["logps"], rollout, b["advantages"][:, None])
    ratio = torch.exp(b["logps"] - rollout).clamp(max=20.0)
    expected = -b["weights"][:, None] * b["advantages"][:, None] * ratio * keep * b["mask"]
    assert_close(grad, expected, **TIGHT)
    assert 0 < keep.sum() < keep.numel()  # the random batch exercises both sides of the mask


@pytest.mark.parametrize("name", LOSSES)
def test_padding_values_do_not_change_the_aggregated_loss_or_gradient(name):
    # Padding positions may hold anything finite: the masked sum and its gradient must not depend on them.
    b = random_batch(3)
    pad = b["mask"] == 0
    gen = torch.Generator().manual_seed(7)
    results = []
    for scale in (0.0, 3.0):
        logps = torch.where(
            pad, b["logps"] - scale * torch.rand(b["logps"].shape, generator=gen, dtype=torch.float64), b["logps"]
        )
        logps.requires_grad_(True)
        kw = {"rollout_logps": b["old_logps"]} if name == "dppo" else {}
        per_token = compute_policy_loss(name, logps, b["old_logps"], b["advantages"], b["mask"], **kw)
        total = aggregate_loss(per_token, b["mask"], weights=b["weights"])
        (grad,) = torch.autograd.grad(total, logps)
        results.append((total.detach(), grad))
    assert_close(results[0][0], results[1][0], **TIGHT)
    assert_close(results[0][1], results[1][1], **TIGHT)


def test_losses_declare_what_they_need_instead_of_the_trainer_naming_them():
    from trl_reasoning.algorithms.losses import POLICY_LOSSES, required_inputs

    assert required_inputs("dppo", divergence="topk_tv") == {"rollout_topk_logps"}
    assert required_inputs("dppo", divergence="binary_kl") == frozenset()
    assert all(required_inputs(name) == frozenset() for name in POLICY_LOSSES.names() if name != "dppo")
    # Only DPPO's ratio is taken against the rollout engine, and only VESPO folds TRL's vLLM correction into its own
    # weight: for both, the trainer must not apply that correction a second time.
    assert [n for n in POLICY_LOSSES.names() if POLICY_LOSSES.traits(n).ratio_to_rollout] == ["dppo"]
    assert [n for n in POLICY_LOSSES.names() if POLICY_LOSSES.traits(n).own_is_correction] == ["vespo"]
    sequence_capable = {n for n in POLICY_LOSSES.names() if POLICY_LOSSES.traits(n).sequence_level}
    assert sequence_capable == {"clip", "cispo", "sapo", "vespo"}
    with pytest.raises(ValueError, match="Unknown policy loss 'ppo'"):
        POLICY_LOSSES.traits("ppo")
