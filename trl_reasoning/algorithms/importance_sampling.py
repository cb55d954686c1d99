"""The importance-sampling correction between the trainer's policy ``pi_old`` and the sampler ``mu``, as one function.

A batch sampled by vLLM (or by an earlier policy, with asynchronous rollouts) is trained with the weight
``w = pi_old / mu`` on each token's loss, truncated or masked to bound its variance. TRL 1.16 builds that weight in
``GRPOTrainer._generate_and_score_completions`` for its four ``vllm_importance_sampling_mode`` values;
:func:`correction_weight` builds it for those four exactly as TRL does (tested for equality) and for three more:

========================  ==========================================================================  ==============
mode                      weight (``d_t = log pi_old(y_t) - log mu(y_t)``, ``m_t`` the loss tokens)    shape
========================  ==========================================================================  ==============
``token_truncate``        ``clamp(exp(d_t), C_min, C_max)`` (TIS)                                      ``(B, T)``
``token_mask``            ``exp(d_t)``, 0 outside ``[C_min, C_max]`` (MIS)                             ``(B, T)``
``sequence_truncate``     ``clamp(exp(sum_t m_t d_t), C_min, C_max)``                                  ``(B, 1)``
``sequence_mask``         ``exp(sum_t m_t d_t)``, 0 outside ``[C_min, C_max]``                          ``(B, 1)``
``sequence_geo_truncate`` ``clamp(exp(sum_t m_t d_t / sum_t m_t), C_min, C_max)`` (geometric mean)     ``(B, 1)``
``sequence_geo_mask``     ``exp(sum_t m_t d_t / sum_t m_t)``, 0 outside ``[C_min, C_max]`` (Geo-RS)     ``(B, 1)``
``token_icepop``          ``exp(d_t)``, 0 outside ``[C_min, C_max]``, and the token gets no gradient   ``(B, T)``
========================  ==========================================================================  ==============

This module imports neither TRL nor the trainer: ``ReasoningTrainer`` calls it at scoring time (where ``pi_old`` comes
from a separate forward) or in the loss (where ``pi_old`` is the loss forward's own detached log-probs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: TRL 1.16's ``vllm_importance_sampling_mode`` values (``GRPOTrainer._generate_and_score_completions``).
TRL_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: TRL 1.16's default ``vllm_importance_sampling_mode`` (``GRPOConfig``).
TRL_DEFAULT_CORRECTION_MODE = "sequence_mask"
#: The modes this package adds (see :func:`correction_weight`).
GEOMETRIC_MODES = ("sequence_geo_truncate", "sequence_geo_mask")
ICEPOP_MODE = "token_icepop"
IMPORTANCE_SAMPLING_MODES = TRL_IMPORTANCE_SAMPLING_MODES + GEOMETRIC_MODES + (ICEPOP_MODE,)
#: The IcePop band ``[alpha, beta]`` of the Ring-1T report (arXiv 2510.18855): ``token_icepop``'s bounds when the
#: config leaves TRL's defaults (``ReasoningConfig._resolve_icepop_band``).
ICEPOP_BAND = (0.5, 5.0)


def is_sequence_mode(mode: str) -> bool:
    """Whether ``mode`` gives one weight per sequence, shape ``(B, 1)``."""
    return mode.startswith("sequence")


def is_masking_mode(mode: str) -> bool:
    """Whether ``mode`` sets weights outside ``[clip_min, clip_max]`` to 0 (else it truncates them)."""
    return mode.endswith("mask") or mode == ICEPOP_MODE


def is_truncating_mode(mode: str) -> bool:
    return mode.endswith("truncate")


def check_mode(mode: str, field_name: str = "vllm_importance_sampling_mode") -> None:
    """Raise a ``ValueError`` naming ``field_name`` and every mode when ``mode`` is not one of them."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(
            f"Unknown {field_name} {mode!r}. Allowed values: {', '.join(repr(m) for m in IMPORTANCE_SAMPLING_MODES)}."
        )


def correction_weight(
    old_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> torch.Tensor:
    """The importance-sampling weight of each loss token (``(B, T)``) or sequence (``(B, 1)``), no gradient.

    ``d_t = (log pi_old(y_t) - log mu(y_t)) * m_t``, with ``d_t = 0`` (a ratio of 1, no correction) where the sampler
    log-prob is NaN (not reported by the engine), as TRL does. Then, by ``mode``:

    - TRL's four (TRL 1.16, ``GRPOTrainer._generate_and_score_completions``, equal to it): ``token_*`` take
      ``rho_t = exp(d_t)``, ``sequence_*`` the product ``rho = exp(sum_t d_t)``; ``*_truncate`` clamps to
      ``[clip_min, clip_max]`` (truncated IS, TIS: Yao et al., "Your Efficient RL Framework Secretly Brings You
      Off-Policy RL Training", 2025), ``*_mask`` sets weights outside ``[clip_min, clip_max]`` to 0 (masked IS,
      MIS); a bound that is ``None`` is no bound.
    - ``sequence_geo_truncate`` / ``sequence_geo_mask``: the geometric mean of the token ratios over the sequence's
      loss tokens whose sampler log-prob is known, ``rho = exp(sum_t d_t / #{t: m_t = 1, mu known})`` (1 for a
      sequence without such tokens), then truncated or masked as above. The product drifts from 1 as the sequence
      grows (its log is a sum of ``T`` terms) and masks or truncates most of a long chain of thought; the geometric
      mean is length-normalised (verl's Geo-RS rejection sampling, "geo_mask"; NeMo-RL's geometric-mean sequence IS).
    - ``token_icepop``: IcePop (Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
      Thinking Model", arXiv 2510.18855, the Ring-1T report): ``M(rho_t) = rho_t`` inside ``[alpha, beta]`` and 0
      outside, ``[alpha, beta]`` set through ``clip_min`` and ``clip_max``; ``ReasoningConfig`` gives a bound left at
      TRL's default IcePop's band ``[0.5, 5]`` (:data:`ICEPOP_BAND`, the values the Ring-1T report gives). The weight
      equals ``token_mask``'s; the trainer also removes the masked tokens from every other gradient term (the KL
      penalty), so that such a token contributes no gradient at all, as in IcePop.
    """
    check_mode(mode)
    mask = mask.to(old_logps.dtype)
    log_diff = torch.nan_to_num((old_logps.detach() - sampler_logps) * mask, nan=0.0)
    if mode in GEOMETRIC_MODES:
        known = mask * (~torch.isnan(sampler_logps)).to(mask.dtype)
        log_ratio = log_diff.sum(dim=-1, keepdim=True) / known.sum(dim=-1, keepdim=True).clamp(min=1.0)
    elif is_sequence_mode(mode):
        log_ratio = log_diff.sum(dim=-1, keepdim=True)
    else:
        log_ratio = log_diff
    ratio = torch.exp(log_ratio)
    if is_truncating_mode(mode):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def weight_share_changed(
    weight: torch.Tensor, mask: torch.Tensor, mode: str, clip_min: float | None, clip_max: float | None
) -> tuple[int, int]:
    """``(changed, counted)``: of the loss tokens (of the sequences with a loss token, for sequence modes), how many
    had their weight changed by the mode: set to 0 (masking modes) or truncated at a bound (truncating modes)."""
    if is_sequence_mode(mode):
        values = weight.reshape(weight.size(0), -1)[:, 0]
        counted = mask.sum(dim=1) > 0
    else:
        values, counted = weight, mask.bool()
    values = values[counted]
    if is_masking_mode(mode):
        changed = values == 0
    else:
        changed = torch.zeros_like(values, dtype=torch.bool)
        if clip_max is not None:
            changed = changed | (values >= clip_max)
        if clip_min is not None:
            changed = changed | (values <= clip_min)
    return int(changed.sum()), int(values.numel())


def effective_sample_size_terms(weight: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``[sum w, sum w^2, n]`` (float64) over the loss tokens (``token_*`` modes) or over the sequences with at least
    one loss token (``sequence_*`` modes): the sums :func:`effective_sample_size` is made of, which add up over
    micro-batches and processes."""
    if is_sequence_mode(mode):
        values = weight.reshape(-1)[mask.sum(dim=1) > 0]
    else:
        values = weight[mask.bool()]
    values = values.double()
    return torch.stack([values.sum(), values.square().sum(), values.new_tensor(float(values.numel()))])


def effective_sample_size(weight: torch.Tensor, mask: torch.Tensor, mode: str) -> float:
    """The normalised effective sample size of the correction weights, ``ESS = (sum_i w_i)^2 / (n sum_i w_i^2)`` in
    ``[0, 1]`` (1: all weights equal; ``1/n``: one weight carries the batch; 0 when every weight is 0), over the loss
    tokens or, for sequence modes, the sequences. VCPO (arXiv 2602.17616) finds its fall predicts training collapse
    under off-policy drift."""
    return ess_from_terms(effective_sample_size_terms(weight, mask, mode))


def ess_from_terms(terms: torch.Tensor) -> float:
    """ESS from summed ``[sum w, sum w^2, n]``."""
    total, squares, count = (float(v) for v in terms)
    return 0.0 if squares <= 0 or count <= 0 else total * total / (count * squares)


@dataclass
class CorrectionStats:
    """TRL's ``sampling/*`` metrics of one generation batch on one process, accumulated over its micro-batches, and
    the ESS terms. :meth:`reduce` gives the logged values with TRL's own cross-process reductions."""

    mode: str
    clip_min: float | None = None
    clip_max: float | None = None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.difference_sum = 0.0
        self.difference_count = 0
        self.difference_max = -math.inf
        self.ratio_sum = 0.0
        self.ratio_count = 0
        self.ratio_min = math.inf
        self.ratio_max = -math.inf
        self.ess_terms = torch.zeros(3, dtype=torch.float64)
        self.changed = 0
        self.counted = 0

    def add(self, old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor):
        """Add the rows of one micro-batch (``mask``: the loss tokens, as TRL's metrics count them)."""
        tokens = mask.bool()
        difference = torch.abs(old_logps.detach() - sampler_logps)[tokens & ~torch.isnan(sampler_logps)]
        if difference.numel():
            self.difference_sum += float(difference.double().sum())
            self.difference_count += difference.numel()
            self.difference_max = max(self.difference_max, float(difference.max()))
        # TRL's ratio metrics: every sequence for sequence modes (padding rows included), loss tokens for token modes
        ratios = weight.flatten() if is_sequence_mode(self.mode) else weight[tokens]
        if ratios.numel():
            self.ratio_sum += float(ratios.double().sum())
            self.ratio_count += ratios.numel()
            self.ratio_min = min(self.ratio_min, float(ratios.min()))
            self.ratio_max = max(self.ratio_max, float(ratios.max()))
        self.ess_terms += effective_sample_size_terms(weight, mask, self.mode).cpu()
        changed, counted = weight_share_changed(weight, mask, self.mode, self.clip_min, self.clip_max)
        self.changed += changed
        self.counted += counted

    def local_values(self) -> list[float]:
        """This process's values, TRL's way: 0.0 for a statistic over no tokens."""
        seen_difference, seen_ratio = self.difference_count > 0, self.ratio_count > 0
        return [
            self.difference_sum / self.difference_count if seen_difference else 0.0,
            self.difference_max if seen_difference else 0.0,
            self.ratio_min if seen_ratio else 0.0,
            self.ratio_sum / self.ratio_count if seen_ratio else 0.0,
            self.ratio_max if seen_ratio else 0.0,
            self.changed / self.counted if self.counted else 0.0,
            *self.ess_terms.tolist(),
        ]

    def reduce(self, gather: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str = "cpu"):
        """The logged values over all processes, in one collective: TRL's reductions (``sampling_logp_difference``:
        mean of the process means, max; ``importance_sampling_ratio``: NaN-ignoring min, mean of process means,
        max), the share of changed weights (mean of the process shares) and the ESS of all weights together.
        Every process must call it the same number of times. Resets the accumulators."""
        local = torch.tensor(self.local_values(), dtype=torch.float64, device=device)
        rows = gather(local).reshape(-1, local.numel()).double().cpu()
        self.reset()
        return {
            "sampling/sampling_logp_difference/mean": rows[:, 0].mean().item(),
            "sampling/sampling_logp_difference/max": rows[:, 1].max().item(),
            "sampling/importance_sampling_ratio/min": _nan_reduce(rows[:, 2], torch.min),
            "sampling/importance_sampling_ratio/mean": rows[:, 3].nanmean().item(),
            "sampling/importance_sampling_ratio/max": _nan_reduce(rows[:, 4], torch.max),
            "is_weight_changed": rows[:, 5].mean().item(),
            "sampling/effective_sample_size": ess_from_terms(rows[:, 6:].sum(dim=0)),
        }


def _nan_reduce(values: torch.Tensor, reduce) -> float:
    known = values[~torch.isnan(values)]
    return reduce(known).item() if known.numel() else math.nan
