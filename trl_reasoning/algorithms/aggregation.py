"""Loss aggregation as per-completion weights fixed on the whole global batch.

Every mode is ``L = sum_{i,t} w_i * l_it * m_it``. The weights ``w_i`` depend only on statistics of the whole
global batch (all processes, all gradient-accumulation micro-batches): the number of unmasked tokens of each
completion, the batch size ``N`` and the group size ``G``. Computing them once, before the batch is split, makes
the gradient of an optimizer step independent of how the batch is split across processes and micro-batches. The one
exception, ``micro_batch_token_mean`` (TRL's ``loss_type="bnpo"``), is registered with ``per_micro_batch=True``: its
weights come from the micro-batch at loss time, as TRL defines it.
Table and sources: ``docs/algorithms.md`` ("Loss aggregation").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .registry import Registry, trait_field

WeightFunction = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class AggregationTraits:
    """What a loss aggregation needs beyond its weight function, as its registration declares it."""

    per_micro_batch: bool = trait_field(
        "its weights come from the micro-batch at loss time, not the global batch (the trainer scales as TRL does).",
        False,
    )


AGGREGATIONS: Registry[WeightFunction] = Registry("loss aggregation", AggregationTraits)


def _safe_reciprocal(x: torch.Tensor) -> torch.Tensor:
    """``1/x``, and ``0`` where ``x == 0`` (a completion without unmasked tokens contributes nothing)."""
    return torch.where(x > 0, 1.0 / x.clamp(min=1e-30), torch.zeros_like(x))


@AGGREGATIONS.register("token_mean")
def token_mean_weights(token_counts: torch.Tensor, **_) -> torch.Tensor:
    """``w_i = 1 / sum_j |y_j|``: every token of the batch weighs the same. DAPO (arXiv 2503.14476, Eq. 12)."""
    total = token_counts.sum().clamp(min=1)
    return torch.ones_like(token_counts) / total


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean_weights(token_counts: torch.Tensor, **_) -> torch.Tensor:
    """``w_i = 1 / (N |y_i|)``: mean over tokens, then over completions. GRPO (arXiv 2402.03300, Eq. 3)."""
    return _safe_reciprocal(token_counts) / token_counts.numel()


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm_weights(
    token_counts: torch.Tensor, max_completion_length: int | None = None, **_
) -> torch.Tensor:
    """``w_i = 1 / (N L_max)``, ``L_max = max_completion_length``: a constant normalizer. Dr. GRPO (arXiv 2503.20783)."""
    if max_completion_length is None or max_completion_length <= 0:
        raise ValueError("The 'seq_mean_token_sum_norm' aggregation needs a positive max_completion_length.")
    return torch.full_like(token_counts, 1.0 / (token_counts.numel() * max_completion_length))


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum_weights(token_counts: torch.Tensor, **_) -> torch.Tensor:
    """``w_i = 1 / N``: sum over tokens, mean over completions (sequence objectives count once). TRL's RLOO."""
    return torch.full_like(token_counts, 1.0 / token_counts.numel())


@AGGREGATIONS.register("prompt_mean")
def prompt_mean_weights(token_counts: torch.Tensor, num_generations: int | None = None, **_) -> torch.Tensor:
    """``w_i = 1 / (P sum_{j in g(i)} |y_j|)``: token mean within each prompt's group, then mean over prompts.

    Source: ScaleRL, arXiv 2510.13786 (prompt-level loss averaging).
    """
    if num_generations is None or num_generations < 1 or token_counts.numel() % num_generations != 0:
        raise ValueError(
            f"The 'prompt_mean' aggregation needs num_generations dividing the batch ({token_counts.numel()} "
            f"completions, num_generations={num_generations})."
        )
    grouped = token_counts.view(-1, num_generations)
    group_tokens = grouped.sum(dim=1, keepdim=True).expand_as(grouped)
    return (_safe_reciprocal(group_tokens) / grouped.size(0)).reshape(-1)


# per_micro_batch (AggregationTraits): the one mode whose gradient depends on how the batch is split; it exists because
# TRL's loss_type="bnpo" is defined that way.
@AGGREGATIONS.register("micro_batch_token_mean", per_micro_batch=True)
def micro_batch_token_mean_weights(token_counts: torch.Tensor, **_) -> torch.Tensor:
    """``w_i = 1 / sum_{j in micro-batch} |y_j|``: token mean over the local micro-batch only (TRL's ``loss_type="bnpo"``).

    The normaliser is the tokens of the micro-batch one process holds, so the gradient of an optimizer step depends on
    ``per_device_train_batch_size``, the number of processes and gradient accumulation (TRL documents this); with one
    micro-batch per step on one process it equals ``token_mean``. Source: TRL ``GRPOConfig.loss_type`` ("bnpo").
    """
    return token_mean_weights(token_counts)


def completion_weights(
    token_counts: torch.Tensor,
    mode: str,
    num_generations: int | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Per-completion weights ``w_i`` of aggregation ``mode`` for the whole global batch.

    Args:
        token_counts: ``(N,)`` number of unmasked loss tokens of each completion, in TRL's group layout.
        mode: a name in ``AGGREGATIONS``.
        num_generations: group size ``G`` (``prompt_mean``).
        max_completion_length: ``L_max`` (``seq_mean_token_sum_norm``).
    """
    fn = AGGREGATIONS.get(mode)
    counts = token_counts if token_counts.is_floating_point() else token_counts.to(torch.float32)
    return fn(counts, num_generations=num_generations, max_completion_length=max_completion_length)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str | None = None,
    *,
    weights: torch.Tensor | None = None,
    num_generations: int | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """``L = sum_{i,t} w_i l_it m_it``.

    Pass ``weights`` computed by :func:`completion_weights` on the global batch when ``per_token_loss`` is one
    slice (a micro-batch on one process) of it. Without ``weights``, they are computed from ``mask`` as if this were
    the whole batch, with ``mode``.
    """
    if weights is None:
        if mode is None:
            raise ValueError("aggregate_loss needs either `mode` or `weights`.")
        # Count tokens in the loss's dtype, so a float64 loss gets float64 weights whatever the mask's dtype.
        token_counts = mask.to(per_token_loss.dtype).sum(dim=-1)
        weights = completion_weights(token_counts, mode, num_generations, max_completion_length)
    weights = weights.to(per_token_loss.dtype)
    return ((per_token_loss * mask.to(per_token_loss.dtype)).sum(dim=-1) * weights).sum()
