"""The sampler's truncated distribution: top-k, top-p (nucleus) and min-p, as pure functions (no TRL import).

With ``top_k > 0``, ``top_p < 1`` or ``min_p`` the sampler draws each token from the *truncated, renormalised*
distribution: the tempered logits ``z = logits / T`` restricted to a support ``S`` and softmaxed over it,
``mu_S(y) = exp(z_y) / sum_{j in S} exp(z_j)`` for ``y in S``. That is what HF ``generate`` samples from (its processed
scores) and what vLLM returns with ``--logprobs-mode processed_logprobs``, the mode TRL requires of a server: the
sampler's log-probs ``mu`` are those of ``mu_S``.

The support is built as the engine builds it: HF ``generate`` applies ``TopKLogitsWarper``, ``TopPLogitsWarper``,
``MinPLogitsWarper`` in that order after the temperature, each on what the previous one kept; vLLM applies min-p first
(on the whole tempered distribution), then top-k and top-p (``engine="vllm"``). At least one token is kept:

- top-k keeps the tokens whose logit is at least the ``k``-th largest (ties kept);
- top-p drops the least likely tokens whose cumulative probability (from the least likely up) is ``<= 1 - top_p``;
- min-p drops the tokens whose probability is below ``min_p`` times the most likely token's.

Scoring the policy on the same support (:func:`truncated_logits`, :func:`truncated_log_probs`) makes
``pi_S / mu_S`` exactly 1 at lag 0; ``trl_reasoning.algorithms.logprobs`` applies it chunk by chunk in the loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

ENGINES = ("generate", "vllm")


@dataclass(frozen=True)
class SamplingTruncation:
    """The sampler's truncation settings. ``top_k = 0``, ``top_p = 1`` and ``min_p = None`` (or 0) are off."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    #: whose order the warpers run in: ``"generate"`` (top-k, top-p, min-p) or ``"vllm"`` (min-p, top-k, top-p).
    #: Only min-p with top-p depends on it (top-p's cumulative mass is taken before or after min-p's cut).
    engine: str = "generate"

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}.")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] or None (off), got {self.min_p!r}.")

    @property
    def truncates(self) -> bool:
        """Whether any setting removes tokens from the support."""
        return self.top_k > 0 or self.top_p < 1.0 or bool(self.min_p)


def sampling_truncation(
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    generation_kwargs: Mapping[str, Any] | None = None,
    engine: str = "generate",
) -> SamplingTruncation:
    """The truncation a TRL run samples with: its ``top_k``, ``top_p``, ``min_p``, where ``generation_kwargs``
    overrides them (TRL passes them on to ``generate`` and to vLLM after its own), in ``engine``'s order. ``None``
    and vLLM's ``top_k = -1`` mean off."""
    settings = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    settings.update({key: value for key, value in (generation_kwargs or {}).items() if key in settings})
    top_k = settings["top_k"]
    top_p = settings["top_p"]
    return SamplingTruncation(
        top_k=0 if top_k is None or top_k < 0 else int(top_k),
        top_p=1.0 if top_p is None else float(top_p),
        min_p=None if not settings["min_p"] else float(settings["min_p"]),
        engine=engine,
    )


def support_mask(z: torch.Tensor, truncation: SamplingTruncation, always: torch.Tensor | None = None) -> torch.Tensor:
    """``True`` where a token is in the sampler's support, for tempered logits ``z`` ``[..., V]`` (a bool tensor of
    ``z``'s shape). ``always`` ``[..., M]``: token ids kept in any case (the sampled token, see
    :func:`truncated_logits`). Entries of ``z`` that are already ``-inf`` (tokens another processor suppressed) are
    outside it. No gradient flows through the choice of the support."""
    with torch.no_grad():
        keep = z > -math.inf
        if truncation.engine == "vllm":
            keep = _min_p(z, keep, truncation.min_p)
        if truncation.top_k > 0 and truncation.top_k < z.size(-1):
            kth = torch.topk(z, truncation.top_k, dim=-1).values[..., -1:]
            keep &= z >= kth
        if truncation.top_p < 1.0:
            kept = z.masked_fill(~keep, -math.inf)
            ascending, order = torch.sort(kept, dim=-1)
            dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - truncation.top_p
            dropped[..., -1] = False  # the most likely token stays
            keep &= ~dropped.scatter(-1, order, dropped)
        if truncation.engine == "generate":
            keep = _min_p(z, keep, truncation.min_p)
        if always is not None:
            keep.scatter_(-1, always, True)
    return keep


def _min_p(z: torch.Tensor, keep: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """``keep`` without the tokens whose probability (over what ``keep`` holds) is below ``min_p`` times the most
    likely one's."""
    if not min_p:
        return keep
    probs = z.masked_fill(~keep, -math.inf).softmax(dim=-1)
    return keep & (probs >= min_p * probs.amax(dim=-1, keepdim=True))


def truncated_logits(
    z: torch.Tensor, truncation: SamplingTruncation, always: torch.Tensor | None = None
) -> torch.Tensor:
    """``z`` with ``-inf`` outside the support (:func:`support_mask`): its softmax is the truncated, renormalised
    distribution. Differentiable in ``z`` inside the support (the support itself is held fixed)."""
    if not truncation.truncates:
        return z
    return z.masked_fill(~support_mask(z.detach(), truncation, always), -math.inf)


def truncated_log_probs(z: torch.Tensor, ids: torch.Tensor, truncation: SamplingTruncation) -> torch.Tensor:
    """``log mu_S(ids)``: the truncated, renormalised log-probabilities of the tempered logits ``z`` ``[..., V]`` at
    ``ids`` ``[...]``, each id kept in its own position's support (see :func:`truncated_logits`)."""
    ids = ids.unsqueeze(-1)
    masked = truncated_logits(z, truncation, always=ids)
    return (masked.gather(-1, ids) - torch.logsumexp(masked, dim=-1, keepdim=True)).squeeze(-1)
