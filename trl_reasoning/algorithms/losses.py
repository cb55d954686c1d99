"""Per-token policy objectives. Each returns the per-token loss ``l_it`` (``-objective``) *before* aggregation.

All inputs are ``(B, T)`` tensors over completion tokens except ``advantages`` (``(B,)`` or ``(B, 1)``; ``(B, T)``
from a token-level estimator, REINFORCE++'s).
Padding positions may hold anything: the aggregation multiplies by the mask, and the functions keep padding
finite. Notation and sources: ``docs/algorithms.md`` ("Per-token policy objectives").

``rho = pi / pi_old = exp(logps - old_logps)``. ``sg`` is stop-gradient (``.detach()``).

A loss may fill the optional ``stats`` dict with boolean ``(B, T)`` (or ``(B, 1)``) tensors that the trainer
logs as means over unmasked tokens, under the key as metric name (e.g. ``"clip_ratio/high_mean"``). The returned tensor is always ``(B, T)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..utils.user_warnings import user_stacklevel
from .anchors import RATIO_ANCHORS
from .registry import Registry, VariantField, at_least, one_of, trait_field

PolicyLoss = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LossTraits:
    """What a policy loss needs or changes beyond its function, as its registration declares it (the config and the
    trainer read these; they never compare the loss's name)."""

    sequence_level: bool = trait_field(
        'honours ``importance_sampling_level="sequence"`` (TRL\'s option): one ratio per sequence.', False
    )
    sequence_ratio_of: str | None = trait_field(
        "it is this other loss with the sequence ratio (``gspo`` is ``clip``'s sequence-ratio form)."
    )
    default_aggregation: str | None = trait_field(
        "the aggregation it takes when neither ``loss_aggregation`` nor ``loss_type`` is set."
    )
    anchors: tuple[str, ...] | None = trait_field(
        "what its ratio can be taken against (``algorithms/anchors.py``); ``None``: ``pi_old`` only."
    )
    async_anchor: str | None = trait_field(
        "the anchor it takes on an asynchronous run when ``ratio_anchor`` is ``None``."
    )
    ignores_delta: bool = trait_field(
        "TRL accepts ``delta`` with it and leaves ``delta`` out of the loss (trl-reasoning warns).", False
    )
    own_is_correction: bool = trait_field(
        "it folds TRL's vLLM importance-sampling ratio into its own weight: the trainer must not apply it on top.",
        False,
    )
    ratio_to_rollout: bool = trait_field(
        "its ratio is taken against the rollout engine's log-probs: no vLLM importance-sampling correction on top.",
        False,
    )
    required_inputs: Callable[..., Iterable[str]] | None = trait_field(
        "``required_inputs(**loss_kwargs)``: what generation must store for it beyond TRL's batch."
    )


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", LossTraits)

#: DPPO divergence name -> default threshold delta (DPPO, arXiv 2602.04879). The top-K variants reuse the binary
#: thresholds of the same divergence (TV 0.15, KL 0.05).
DPPO_DEFAULT_THRESHOLDS = {"binary_tv": 0.15, "binary_kl": 0.05, "topk_tv": 0.15, "topk_kl": 0.05}


def topk_divergence(
    rollout_topk_logps: torch.Tensor,
    current_topk_logps: torch.Tensor,
    kind: str = "tv",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """DPPO's top-K divergence between the rollout distribution ``mu`` and the current one ``pi``, per position.

    The distributions are reduced to the rollout's top-K tokens (``mu_k = exp(rollout_topk_logps)``,
    ``pi_k = exp(current_topk_logps)`` at the same ids) plus one "rest" bucket,
    ``mu_rest = max(1 - sum_k mu_k, 0)`` (likewise ``pi_rest``), computed as ``-expm1(logsumexp_k log mu_k)`` to keep
    precision when the rest is tiny:

    - ``kind="tv"``: ``D = 1/2 (sum_k |mu_k - pi_k| + |mu_rest - pi_rest|)``
    - ``kind="kl"``: ``D = sum_k mu_k log(mu_k / pi_k) + mu_rest log(mu_rest / pi_rest)`` (``KL(mu || pi)``), with
      ``0 log 0 = 0``; a ``pi`` term of exactly 0 is floored at the dtype's ``tiny``, so ``D`` stays finite.

    With ``K = vocab`` this is the exact TV / KL. Positions where ``mask`` is 0, or where ``rollout_topk_logps``
    holds a ``NaN`` (the engine could not score them), give ``D = 0`` and no ``NaN`` (values or gradients).
    Differentiable in ``current_topk_logps``. Source: DPPO, arXiv 2602.04879 (top-K approximation).

    Args:
        rollout_topk_logps: ``[B, T, K]`` log-probs of the rollout's top-K tokens (:func:`trl_reasoning.algorithms.logprobs.rollout_topk`).
        current_topk_logps: ``[B, T, K]`` the current policy's log-probs at the same ids
            (:func:`trl_reasoning.algorithms.logprobs.chunked_logps`).
        kind: ``"tv"`` or ``"kl"``.
        mask: optional ``[B, T]``, 1 where the position counts.

    Returns:
        ``D`` ``[B, T]`` in the dtype of ``current_topk_logps``.
    """
    if kind not in ("tv", "kl"):
        raise ValueError(f"Unknown top-K divergence kind {kind!r}. Allowed values: tv, kl.")
    if rollout_topk_logps.shape != current_topk_logps.shape:
        raise ValueError(
            f"rollout_topk_logps {tuple(rollout_topk_logps.shape)} and current_topk_logps "
            f"{tuple(current_topk_logps.shape)} must have the same [B, T, K] shape"
        )
    dtype = current_topk_logps.dtype
    mu_log = rollout_topk_logps.detach().to(dtype)
    valid = ~torch.isnan(mu_log).any(dim=-1)
    if mask is not None:
        valid = valid & (mask != 0)
    # Invalid positions are replaced by a harmless distribution (both sides equal) before any arithmetic, so neither
    # the value nor the gradient can pick up a NaN/inf from padding.
    filler = torch.full_like(mu_log, -math.log(mu_log.shape[-1] + 1))
    mu_log = torch.where(valid.unsqueeze(-1), mu_log, filler)
    pi_log = torch.where(valid.unsqueeze(-1), current_topk_logps, filler)
    mu_k, pi_k = mu_log.exp(), pi_log.exp()
    mu_rest = (-torch.expm1(torch.logsumexp(mu_log, dim=-1).clamp(max=0.0))).clamp(min=0.0)
    pi_rest = (-torch.expm1(torch.logsumexp(pi_log, dim=-1).clamp(max=0.0))).clamp(min=0.0)
    if kind == "tv":
        div = 0.5 * ((mu_k - pi_k).abs().sum(-1) + (mu_rest - pi_rest).abs())
    else:
        div = _bucketed_kl(mu_log, pi_log, mu_rest, pi_rest)
    return torch.where(valid, div, torch.zeros_like(div))


def _bucketed_kl(
    mu_log: torch.Tensor, pi_log: torch.Tensor, mu_rest: torch.Tensor, pi_rest: torch.Tensor
) -> torch.Tensor:
    """``KL(mu || pi)`` over the top-K buckets and the rest bucket of :func:`topk_divergence`, with ``0 log 0 = 0``
    and ``pi`` floored at the dtype's ``tiny`` so the value stays finite."""
    tiny = torch.finfo(pi_log.dtype).tiny
    mu_k = mu_log.exp()
    # mu * (log mu - log pi), zero where mu = 0; log pi floored so a vanished pi gives a large finite term.
    top = torch.where(mu_k > 0, mu_k * (mu_log - pi_log.clamp(min=math.log(tiny))), torch.zeros_like(mu_k)).sum(-1)
    rest_log_ratio = mu_rest.clamp(min=tiny).log() - pi_rest.clamp(min=tiny).log()
    rest = torch.where(mu_rest > 0, mu_rest * rest_log_ratio, torch.zeros_like(mu_rest))
    return top + rest


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None,
    stats: dict | None,
) -> torch.Tensor:
    """``-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``; ``delta`` caps ``rho`` from above (TRL's two-sided clip)."""
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if stats is not None:
        stats["clip_ratio/low_mean"] = (ratio < 1 - epsilon_low) & (advantages < 0)
        stats["clip_ratio/high_mean"] = (ratio > 1 + epsilon_high) & (advantages > 0)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * advantages, clipped * advantages)


#: TRL's ``importance_sampling_level`` values: the ratio per token, or one ratio per sequence (GSPO's length-normalised
#: ``exp(mean_t log rho_t)``) shared by the sequence's tokens.
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def importance_ratio(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    advantages: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rho = pi / pi_old``: ``(B, T)`` per token (``level="token"``), or ``(B, 1)`` per sequence
    (``level="sequence"``): ``s_i = exp(sum_t m_t (log pi - log pi_old) / sum_t m_t)``, TRL's
    ``importance_sampling_level`` (GSPO, arXiv 2507.18071, Eq. 7).

    With ``level="sequence"`` and per-token ``advantages`` (``(B, T)``, e.g. REINFORCE++'s returns) the ratio is
    GSPO-token's ``s_it = sg[s_i] * pi_t / sg[pi_t]`` (GSPO §4.3), ``(B, T)``: every token carries ``s_i``'s value
    (so the clip acts per sequence as before) and its own gradient ``s_i * grad log pi_t``, which its own advantage
    weights. Differentiating ``s_i`` itself would weight every token's gradient by the sequence's mean advantage. With
    one advantage per sequence the two forms have the same value and gradient (GSPO §4.3), and ``(B, 1)`` is kept."""
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"Unknown importance_sampling_level {level!r}. Allowed values: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}."
        )
    log_ratio = logps - old_logps
    if level == "sequence":
        lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
        log_ratio = (log_ratio * mask).sum(dim=-1, keepdim=True) / lengths
        if advantages is not None and advantages.dim() == logps.dim() and advantages.shape[-1] > 1:
            return torch.exp(log_ratio.detach() + logps - logps.detach())
    return torch.exp(log_ratio)


def check_clip_bounds(config: Any) -> None:
    """The clip's upper bound ``1 + epsilon_high`` must not sit closer to 1 than its lower bound ``1 - epsilon``."""
    epsilon_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    if epsilon_high < config.epsilon:
        raise ValueError(
            f"epsilon_high={epsilon_high} is below epsilon={config.epsilon}: the clip's upper bound 1 + epsilon_high "
            "would sit closer to 1 than its lower bound 1 - epsilon (DAPO's clip-higher is epsilon_high >= "
            "epsilon). Raise epsilon_high, or lower epsilon."
        )


# Its traits' meanings are LossTraits' fields. async_anchor: the clip takes AReaL's decoupled form: against pi_old alone it
# never acts at one step a batch and nothing bounds the stale sampler's weight; against the sampler it blocked so
# many stale tokens that it trained worse (evidence v5, async_k8: clip_sampler - clip -0.14 pass@1); decoupled, each
# token is weighted by min(pi_old / mu, C) and the clip bounds the steps a batch feeds (docs/which-preset.md).
@POLICY_LOSSES.register(
    "clip", sequence_level=True, anchors=RATIO_ANCHORS, async_anchor="decoupled", checks=(check_clip_bounds,)
)
def clip_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    stats: dict | None = None,
) -> torch.Tensor:
    """PPO/GRPO clipped surrogate per token: ``l = -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``.

    DAPO's clip-higher is ``eps_high = 0.28 > eps_low = 0.2``. ``delta`` (INTELLECT-2, TRL's ``delta``) caps the
    unclipped ratio from above. ``importance_sampling_level="sequence"`` takes one ratio per sequence
    (:func:`importance_ratio`), whose loss every token of the sequence carries, as TRL does for any ``loss_type``.
    Sources: PPO arXiv 1707.06347; GRPO arXiv 2402.03300; DAPO arXiv 2503.14476 (Eq. 10).
    """
    ratio = importance_ratio(logps, old_logps, mask, importance_sampling_level, advantages)
    return _clipped_surrogate(ratio, advantages, epsilon_low, epsilon_high, delta, stats).expand_as(logps)


def warn_cispo_cap_below_one(config: Any) -> None:
    """CISPO's ``epsilon_high`` is an absolute cap on the ratio: below 1 it shrinks every token's weight. TRL accepts
    it (its cap defaults to ``epsilon=0.2`` when ``epsilon_high`` is unset), so this only warns."""
    epsilon_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    if epsilon_high < 1.0:
        warnings.warn(
            f"epsilon_high={epsilon_high} is below 1 with policy_loss={config.policy_loss!r}, where it is an absolute "
            "cap on the importance ratio (TRL's semantics; the paper's 1 + eps_high): a cap below the on-policy ratio "
            "1 shrinks every token's weight. TRL recommends epsilon_high=5.0 (ScaleRL found 4, 5 and 8 alike).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


# async_anchor="sampler": on an asynchronous batch (async_rollouts) the trainer passes the sampler's log-probs as
# old_logps: CISPO's weight is then min(pi / mu, c), as ScaleRL trains it with PipelineRL. ignores_delta: TRL accepts
# `delta` with this loss type and leaves it out of the loss (so does trl-reasoning, with a warning).
@POLICY_LOSSES.register(
    "cispo",
    sequence_level=True,
    anchors=RATIO_ANCHORS,
    async_anchor="sampler",
    ignores_delta=True,
    checks=(warn_cispo_cap_below_one,),
)
def cispo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_high: float = 5.0,
    importance_sampling_level: str = "token",
    stats: dict | None = None,
) -> torch.Tensor:
    """CISPO: ``l = -sg(min(rho, c)) * A * log pi``; every token keeps a gradient, only its weight is capped.

    ``c = epsilon_high`` is an absolute cap on the ratio (TRL's semantics; the paper's ``1 + eps_high^IS``). With
    ``importance_sampling_level="sequence"`` ``rho`` is the sequence ratio (TRL's option).
    Source: MiniMax-M1, arXiv 2506.13585 (Eq. 4-5); ``c = 5`` per ScaleRL as TRL documents.
    """
    ratio = importance_ratio(logps, old_logps, mask, importance_sampling_level)
    if stats is not None:
        stats["clip_ratio/high_mean"] = (ratio > epsilon_high) & (advantages > 0)
    return -torch.clamp(ratio, max=epsilon_high).detach() * advantages * logps


_SAPO_FIELDS = (
    VariantField(
        "sapo_temperature_pos",
        1.0,
        "SAPO's gate temperature where the advantage is positive.",
        parameter="sapo_temperature_pos",
        defined_by_trl=True,
    ),
    VariantField(
        "sapo_temperature_neg",
        1.05,
        "SAPO's gate temperature where the advantage is not positive.",
        parameter="sapo_temperature_neg",
        defined_by_trl=True,
    ),
)


@POLICY_LOSSES.register(
    "sapo",
    sequence_level=True,
    anchors=RATIO_ANCHORS,
    async_anchor="decoupled",
    ignores_delta=True,
    fields=_SAPO_FIELDS,
)
def sapo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    importance_sampling_level: str = "token",
    stats: dict | None = None,
) -> torch.Tensor:
    """SAPO's soft gate instead of a hard clip: ``l = -sigmoid(tau (rho - 1)) * 4 / tau * A``, ``tau =
    sapo_temperature_pos`` where ``A > 0`` and ``sapo_temperature_neg`` otherwise.

    At ``rho = 1`` the gate's gradient equals the unclipped surrogate's (``d/d rho = A``); far from 1 it fades
    smoothly instead of dropping to zero. TRL's ``loss_type="sapo"`` (defaults ``tau_pos = 1.0``, ``tau_neg =
    1.05``). Source: SAPO, Soft Adaptive Policy Optimization, arXiv 2511.20347.
    """
    ratio = importance_ratio(logps, old_logps, mask, importance_sampling_level, advantages)
    temperature = torch.where(
        advantages > 0,
        torch.as_tensor(sapo_temperature_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(sapo_temperature_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gate = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature
    return (-gate * advantages).expand_as(logps)


def vespo_weights(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None = None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """VESPO's gamma weight of each sequence, ``(B, 1)``, without gradient: ``phi(w) = e^lambda w^k e^(-lambda w)``
    (so ``phi(1) = 1``), ``(k, lambda) = (k_pos, lambda_pos)`` where ``A >= 0`` else ``(k_neg, lambda_neg)``.

    ``w`` is the sequence's importance ratio, the product over its tokens (a sum of log-ratios, each clamped to
    ``[-20, 20]``), times the product of the rollout-mismatch ratios ``importance_sampling_ratio`` (TRL's vLLM
    correction, ``(B, T)``) when given; ``log w`` is clamped to ``[log 1e-8, 20]`` and ``lambda`` to ``>= 1e-4``.
    Computed in log space; a non-finite weight becomes 0. The clamps are TRL 1.16's (``GRPOTrainer.get_gamma_weights``,
    which follows the authors' implementation). Source: VESPO, arXiv 2602.10693.
    """
    with torch.no_grad():
        floor = math.log(1e-8)
        log_ratio = torch.clamp((logps - old_logps).detach(), -20.0, 20.0)
        log_w = (log_ratio * mask).sum(dim=-1, keepdim=True)
        if importance_sampling_ratio is not None:
            log_is = torch.clamp(torch.log(importance_sampling_ratio.detach()), floor, 20.0)
            log_w = log_w + log_is.sum(dim=-1, keepdim=True)
        log_w = torch.clamp(log_w, floor, 20.0)
        nonnegative = advantages >= 0
        k = torch.where(nonnegative, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonnegative, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# own_is_correction: the loss folds TRL's vLLM importance-sampling ratio into its own weight, so the trainer must not
# multiply it on top (TRL skips that multiplication for loss_type="vespo" too). sequence_level: its ratio is always the
# sequence's, whatever importance_sampling_level says (TRL accepts "sequence" with a warning).
_VESPO_FIELDS = tuple(
    VariantField(
        f"vespo_{name}", default, f"VESPO's gamma weight: {meaning}.", parameter=f"vespo_{name}", defined_by_trl=True
    )
    for name, default, meaning in (
        ("k_pos", 2.0, "the power k where the advantage is >= 0"),
        ("lambda_pos", 3.0, "the rate lambda where the advantage is >= 0"),
        ("k_neg", 3.0, "the power k where the advantage is < 0"),
        ("lambda_neg", 2.0, "the rate lambda where the advantage is < 0"),
    )
)


# anchors: with TRL's correction folded in, its weight is already taken against the sampler (pi / pi_old times
# pi_old / mu), so "pi_old" stays its asynchronous anchor.
@POLICY_LOSSES.register(
    "vespo",
    own_is_correction=True,
    sequence_level=True,
    anchors=("pi_old", "sampler"),
    async_anchor="pi_old",
    ignores_delta=True,
    fields=_VESPO_FIELDS,
)
def vespo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None = None,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    stats: dict | None = None,
) -> torch.Tensor:
    """VESPO: ``l = -sg(phi(w)) * A * log pi`` with the sequence's gamma weight ``phi(w)`` (:func:`vespo_weights`):
    a smooth, asymmetric down-weighting of sequences whose importance ratio ``w`` left 1, in place of clipping.

    TRL's ``loss_type="vespo"`` (defaults ``k_pos = 2, lambda_pos = 3, k_neg = 3, lambda_neg = 2``); the ratio is
    always the sequence product (TRL warns when ``importance_sampling_level`` is not ``"token"``).
    Source: VESPO, arXiv 2602.10693.
    """
    phi = vespo_weights(
        logps,
        old_logps,
        advantages,
        mask,
        importance_sampling_ratio,
        k_pos=vespo_k_pos,
        lambda_pos=vespo_lambda_pos,
        k_neg=vespo_k_neg,
        lambda_neg=vespo_lambda_neg,
    )
    if stats is not None:
        stats["vespo/phi_seq_mean"] = phi
    return -phi * advantages * logps


def dppo_divergence_mask(
    logps: torch.Tensor,
    rollout_logps: torch.Tensor,
    advantages: torch.Tensor,
    divergence: str = "binary_tv",
    threshold: float | None = None,
    rollout_topk_logps: torch.Tensor | None = None,
    topk_logps: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPPO's trust-region mask ``M`` and the divergence ``D`` per token (both without gradient).

    ``M = 0`` where the update would push further in the advantage's direction past the trust region:
    ``(A > 0 and pi > mu and D > delta) or (A < 0 and pi < mu and D > delta)``; else ``M = 1``, with ``pi``/``mu``
    the current/rollout probabilities of the sampled token.
    ``binary_tv``: ``D = |pi - mu|``. ``binary_kl``: ``D = mu log(mu/pi) + (1-mu) log((1-mu)/(1-pi))``.
    ``topk_tv`` / ``topk_kl``: ``D`` = :func:`topk_divergence` of ``rollout_topk_logps`` and ``topk_logps``
    (``[B, T, K]``, the rollout's top-K and the current log-probs at the same ids), which both must be given; ``mask``
    (``[B, T]``) only zeroes ``D`` at padding. Source: DPPO, arXiv 2602.04879.
    """
    if divergence not in DPPO_DEFAULT_THRESHOLDS:
        raise ValueError(
            f"Unknown dppo_divergence {divergence!r}. Allowed values: {', '.join(DPPO_DEFAULT_THRESHOLDS)}."
        )
    if divergence.startswith("topk_"):
        missing = [
            name
            for name, value in (("rollout_topk_logps", rollout_topk_logps), ("topk_logps", topk_logps))
            if value is None
        ]
        if missing:
            raise ValueError(
                f"dppo_divergence={divergence!r} needs {' and '.join(missing)} ([B, T, K] log-probs of the rollout's "
                "top-K tokens, stored at generation time, and of the current policy at the same ids)."
            )
    delta = DPPO_DEFAULT_THRESHOLDS[divergence] if threshold is None else threshold
    with torch.no_grad():
        pi = torch.exp(logps)
        mu = torch.exp(rollout_logps)
        if divergence.startswith("topk_"):
            div = topk_divergence(rollout_topk_logps, topk_logps.detach(), divergence.removeprefix("topk_"), mask)
            div = div.to(pi.dtype)
        elif divergence == "binary_tv":
            div = (pi - mu).abs()
        else:
            # Both sides of the Bernoulli (sampled token vs the rest); probabilities are kept inside (0, 1).
            tiny = torch.finfo(pi.dtype).tiny
            pi_c = pi.clamp(tiny, 1.0)
            mu_c = mu.clamp(tiny, 1.0)
            rest_pi = (1 - pi).clamp(min=tiny)
            rest_mu = (1 - mu).clamp(min=0.0)
            div = mu_c * (mu_c.log() - pi_c.log()) + rest_mu * (rest_mu.clamp(min=tiny).log() - rest_pi.log())
        outside = div > delta
        blocked = ((advantages > 0) & (pi > mu) & outside) | ((advantages < 0) & (pi < mu) & outside)
    return (~blocked).to(logps.dtype), div


def _dppo_required_inputs(divergence: str = "binary_tv", **_: Any) -> frozenset[str]:
    return frozenset({"rollout_topk_logps"}) if divergence.startswith("topk_") else frozenset()


def check_dppo_entropy(config: Any) -> None:
    """The entropy bonus needs the entropy's gradient, which the top-K divergences' chunked forward does not give."""
    if "rollout_topk_logps" in _dppo_required_inputs(config.dppo_divergence) and (
        config.entropy_coef != 0.0 or config.use_adaptive_entropy
    ):
        raise ValueError(
            f"entropy_coef / use_adaptive_entropy need the entropy's gradient, which dppo_divergence="
            f"{config.dppo_divergence!r}'s chunked forward does not provide. Use 'binary_tv' or 'binary_kl', or set "
            "entropy_coef=0.0 and use_adaptive_entropy=False."
        )


_DPPO_FIELDS = (
    VariantField(
        "dppo_divergence",
        "binary_tv",
        f"The divergence of DPPO's trust-region mask, one of {', '.join(DPPO_DEFAULT_THRESHOLDS)}: binary (the sampled "
        "token against the rest) or top-K (the rollout's top-`dppo_topk` tokens and a rest bucket, kept at generation).",
        parameter="divergence",
        check=one_of(DPPO_DEFAULT_THRESHOLDS),
    ),
    VariantField(
        "dppo_topk",
        20,
        'DPPO: K of the `"topk_*"` divergences.',
        check=at_least(1, integer=True),
    ),
    VariantField(
        "dppo_threshold",
        None,
        "The mask's threshold δ; `None` takes the paper's default for the divergence (0.15 TV, 0.05 KL).",
        parameter="threshold",
        check=at_least(0, optional=True, note="or None for the paper default"),
    ),
    VariantField(
        "dppo_is_cap",
        None,
        (
            "Optional cap `C` on DPPO's importance ratio `π / μ_rollout` (`w = min(π / μ_rollout, C)`). `None`, the "
            'authors\' setting, applies no cap (their verl script sets `clip_ratio_c=10000` "for a fair comparison").'
        ),
        parameter="is_cap",
        check=at_least(
            1,
            optional=True,
            note="a cap on the ratio pi / mu_rollout below the on-policy ratio 1 shrinks every token's weight",
        ),
    ),
)


# ratio_to_rollout: the ratio is already taken against the rollout engine's log-probs, so its only anchor is the
# sampler.
@POLICY_LOSSES.register(
    "dppo",
    ratio_to_rollout=True,
    anchors=("sampler",),
    async_anchor="sampler",
    required_inputs=_dppo_required_inputs,
    fields=_DPPO_FIELDS,
    checks=(check_dppo_entropy,),
)
def dppo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_logps: torch.Tensor | None = None,
    divergence: str = "binary_tv",
    threshold: float | None = None,
    is_cap: float | None = None,
    rollout_topk_logps: torch.Tensor | None = None,
    topk_logps: torch.Tensor | None = None,
    stats: dict | None = None,
) -> torch.Tensor:
    """DPPO: ``l = -A * sg(w) * M * log pi`` with ``w = pi / mu_roll`` (``min(pi / mu_roll, C)`` with a cap ``C``)
    and the divergence mask ``M``.

    ``mu_roll`` is the rollout engine's probability (vLLM's sampling logprobs) or, without one, ``pi_old``
    (``rollout_logps=None``). Positions where ``rollout_logps`` is ``NaN`` (vLLM could not score them) fall back to
    ``pi_old``. ``divergence="topk_tv"``/``"topk_kl"`` need ``rollout_topk_logps`` and ``topk_logps`` ``[B, T, K]``
    (see :func:`dppo_divergence_mask`); they only feed the mask, so they need no gradient.
    Source: DPPO, arXiv 2602.04879. No cap by default, as the authors run it: their verl script
    (sail-sg/Stable-RL, ``examples/dppo_trainer/run_qwen30b_dppo.sh``) sets ``clip_ratio_c=10000`` to turn off the
    dual-clip and truncated-IS caps; ``is_cap`` is an opt-in.
    """
    if rollout_logps is None:
        rollout_logps = old_logps
    else:
        rollout_logps = torch.where(torch.isnan(rollout_logps), old_logps, rollout_logps)
    keep, div = dppo_divergence_mask(
        logps, rollout_logps, advantages, divergence, threshold, rollout_topk_logps, topk_logps, mask
    )
    weight = torch.exp(logps - rollout_logps)
    if is_cap is not None:
        weight = torch.clamp(weight, max=is_cap)
    weight = weight.detach()
    if stats is not None:
        stats["dppo/masked_frac_pos_adv"] = (keep == 0) & (advantages > 0)
        stats["dppo/masked_frac_neg_adv"] = (keep == 0) & (advantages < 0)
        stats["dppo/divergence_mean"] = div
    return -advantages * weight * keep * logps


def _sequence_log_ratio_sum(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((logps - old_logps) * mask).sum(dim=-1, keepdim=True)


@POLICY_LOSSES.register("sequence_clip", anchors=RATIO_ANCHORS, async_anchor="decoupled")
def sequence_clip_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    stats: dict | None = None,
) -> torch.Tensor:
    """Sequence-ratio clip (TRL's ``RLOOTrainer``): ``rho_s = exp(sum_t m_t (log pi - log pi_old))``,
    ``l_i = -min(rho_s*A, clip(rho_s, 1-eps_low, 1+eps_high)*A)``.

    ``l_i`` is spread evenly over the sequence's unmasked tokens (``l_it = l_i / |y_i|``), so that
    ``sum_t m_it l_it = l_i``: with the ``seq_mean_token_sum`` aggregation the loss is ``mean_i l_i``, as in TRL.
    With one update per batch this is REINFORCE leave-one-out. Source: arXiv 2402.14740; TRL ``RLOOTrainer``.
    """
    ratio = torch.exp(_sequence_log_ratio_sum(logps, old_logps, mask))
    per_sequence = _clipped_surrogate(ratio, advantages, epsilon_low, epsilon_high, None, stats)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return (per_sequence / lengths) * mask


# sequence_ratio_of: this is "clip" with importance_sampling_level="sequence" (TRL's loss_type="grpo" with it);
# default_aggregation: TRL's grpo's.
@POLICY_LOSSES.register(
    "gspo",
    sequence_ratio_of="clip",
    default_aggregation="seq_mean_token_mean",
    anchors=RATIO_ANCHORS,
    async_anchor="decoupled",
    checks=(check_clip_bounds,),
)
def gspo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    stats: dict | None = None,
) -> torch.Tensor:
    """GSPO: the clipped surrogate with the length-normalized sequence ratio ``s_i = exp(mean_t log rho_it)``.

    The sequence loss is broadcast to every token, so ``seq_mean_token_mean`` gives ``mean_i l_i`` (TRL's
    ``importance_sampling_level="sequence"`` with ``loss_type="grpo"``), and ``seq_mean_token_sum`` gives
    ``mean_i |y_i| l_i`` (TRL's ``loss_type="luspo"``, LUSPO arXiv 2602.05261). This is ``clip`` with
    ``importance_sampling_level="sequence"``. Source: GSPO, arXiv 2507.18071 (Eq. 7).
    """
    return clip_loss(
        logps,
        old_logps,
        advantages,
        mask,
        epsilon_low,
        epsilon_high,
        delta,
        importance_sampling_level="sequence",
        stats=stats,
    )


def base_objective(name: str) -> str:
    """The objective ``name`` is a form of: ``"clip"`` for ``"gspo"`` (its sequence-ratio form), else ``name``."""
    return POLICY_LOSSES.traits(name).sequence_ratio_of or name


def sequence_ratio_form(name: str) -> str:
    """The loss registered as ``name`` with the sequence ratio (``"gspo"`` for ``"clip"``), else ``name``."""
    forms = [other for other in POLICY_LOSSES.with_trait("sequence_ratio_of") if base_objective(other) == name]
    return forms[0] if forms else name


def ratio_anchors(name: str) -> tuple[str, ...]:
    """The anchors the policy loss ``name`` can take its ratio against (``trl_reasoning.algorithms.anchors``); a loss
    registered without the trait takes ``pi_old`` only."""
    return tuple(POLICY_LOSSES.traits(name).anchors or ("pi_old",))


def async_anchor(name: str) -> str | None:
    """The anchor the policy loss ``name`` takes on an asynchronous run when ``ratio_anchor`` is ``None``."""
    return POLICY_LOSSES.traits(name).async_anchor


def required_inputs(name: str, **loss_kwargs: Any) -> frozenset[str]:
    """What the policy loss ``name``, configured with ``loss_kwargs`` (e.g. ``divergence``), needs stored at
    generation time beyond TRL's batch: ``{"rollout_topk_logps"}`` for DPPO's top-K divergences, else nothing."""
    declared = POLICY_LOSSES.traits(name).required_inputs
    return frozenset() if declared is None else frozenset(declared(**loss_kwargs))


def compute_policy_loss(
    name: str,
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **kwargs,
) -> torch.Tensor:
    """Per-token loss ``(B, T)`` of the policy objective registered as ``name``.

    Args:
        name: a name in ``POLICY_LOSSES``.
        logps: ``(B, T)`` log-probabilities of the sampled tokens under the current policy (with gradient).
        old_logps: ``(B, T)`` the behaviour policy's log-probabilities (no gradient).
        advantages: ``(B,)`` or ``(B, 1)`` one advantage per completion (or ``(B, T)`` per token).
        mask: ``(B, T)`` 1 for completion tokens that count in the loss.
        **kwargs: the loss's own parameters (``epsilon_low``, ``epsilon_high``, ``delta``, ``rollout_logps``,
            ``divergence``, ``threshold``, ``is_cap``, ``rollout_topk_logps``, ``topk_logps``, ``stats``).
    """
    fn = POLICY_LOSSES.get(name)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = mask.to(logps.dtype)
    return fn(logps, old_logps.detach(), advantages, mask, **kwargs)
