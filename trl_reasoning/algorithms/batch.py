"""The batch: advantages and loss weights of a gathered batch and its active groups, and row regrouping.

Pure tensors, no trainer: the seam hands in the gathered rewards and token counts, gets the per-row advantages and
loss weights ``w_i`` back (``docs/algorithms.md``, "Loss aggregation": fixed on the whole global batch), and scatters
this process's rows. Dynamic sampling builds its batch from rows of several generation rounds with ``stack_rows``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import TOKEN_INPUTS, compute_advantages, zero_advantages
from .aggregation import completion_weights


@dataclass(frozen=True)
class TrainBatch:
    """What one generation batch trains on, as the trainer fixed it (``ReasoningTrainer.last_train_batch``): the shaped
    ``rewards`` and ``advantages`` of the gathered batch (all processes, group by group), which groups train
    (``active_groups``, one bool per group; ``None`` when every group trains), this process's ``loss_weights`` and
    ``generation_rounds``: ``(groups generated, informative groups)`` of each generation round behind the batch (all
    processes; one round unless dynamic sampling generated more). ``advantages`` is ``(N,)``, or ``(N, T)`` for a
    token-level estimator (REINFORCE++'s: one per completion token, ``0`` on padding). Read it from a callback's
    ``on_step_end`` to see what a step trained on."""

    rewards: torch.Tensor
    advantages: torch.Tensor
    active_groups: torch.Tensor | None
    loss_weights: torch.Tensor
    generation_rounds: tuple[tuple[int, int], ...] = ()


def batch_advantages_and_weights(
    rewards: torch.Tensor,
    token_counts: torch.Tensor,
    num_generations: int,
    estimator: str,
    aggregation: str,
    max_completion_length: int | None,
    active_groups: torch.Tensor | None = None,
    normalize_advantages: bool = False,
    **estimator_kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Advantages and loss weights of every completion of a gathered batch.

    With ``active_groups`` (one bool per group), inactive groups train nothing: their advantages and weights are 0 and
    both the estimator and the aggregation's normaliser see only the active groups (a filtered group must not shrink
    the batch std or the token count). Without it every group is active.

    Args:
        rewards: ``(N,)`` shaped rewards, groups of ``num_generations`` consecutive (``NaN`` = unscorable).
        token_counts: ``(N,)`` completion tokens that count in the loss.
        num_generations: the group size ``G``.
        estimator: a name in ``ADVANTAGE_ESTIMATORS``; ``estimator_kwargs`` are offered to it by name.
        aggregation: a name in ``AGGREGATIONS``.
        max_completion_length: ``L_max`` of the constant-length normalisers.
        active_groups: ``(N / G,)`` bool, or ``None``.
        normalize_advantages: standardise the advantages over the batch's active rows (TRL's
            ``RLOOConfig.normalize_advantages``).
        estimator_kwargs: offered to the estimator by name; the per-token inputs of a token-level estimator
            (``TOKEN_INPUTS``, ``(N, T)`` each) are restricted to the active rows with the rewards.

    Returns:
        ``(advantages, weights, active_rows)``: ``(N,)`` each (``advantages`` ``(N, T)`` from a token-level
        estimator); ``active_rows`` is ``None`` without ``active_groups``.
    """
    if active_groups is None:
        advantages = compute_advantages(
            rewards, num_generations, estimator, normalize=normalize_advantages, **estimator_kwargs
        )
        weights = completion_weights(token_counts, aggregation, num_generations, max_completion_length)
        return advantages, weights, None
    active_rows = active_groups.to(device=rewards.device, dtype=torch.bool).repeat_interleave(num_generations)
    if active_rows.shape != rewards.shape:
        raise ValueError(
            f"active_groups has {active_groups.numel()} groups of {num_generations}, but the batch has "
            f"{rewards.numel()} completions"
        )
    advantages = zero_advantages(rewards, estimator, estimator_kwargs.get("completion_mask"))
    weights = torch.zeros_like(token_counts)
    if bool(active_rows.any()):
        active_kwargs = {
            key: value[active_rows] if key in TOKEN_INPUTS and value is not None else value
            for key, value in estimator_kwargs.items()
        }
        advantages[active_rows] = compute_advantages(
            rewards[active_rows], num_generations, estimator, normalize=normalize_advantages, **active_kwargs
        )
        weights[active_rows] = completion_weights(
            token_counts[active_rows], aggregation, num_generations, max_completion_length
        )
    return advantages, weights, active_rows


#: Per-row tensors as long as the prompt and the completion together (aligned with the input ids): regrouping rows of
#: generation rounds with other lengths pads their prompt part on the left and their completion part on the right.
SPANNING_KEYS = ("token_type_ids", "mm_token_type_ids")
_PROMPT_PART, _COMPLETION_PART = "prompt_part:", "completion_part:"


def split_spanning(rows: dict, prompt_length: int) -> dict:
    """``rows`` with each :data:`SPANNING_KEYS` tensor cut at ``prompt_length`` into a prompt part (padded on the left
    by :func:`stack_rows`) and a completion part (padded on the right); :func:`join_spanning` puts them back."""
    out = {}
    for key, value in rows.items():
        if key in SPANNING_KEYS and isinstance(value, torch.Tensor) and value.dim() == 2:
            out[_PROMPT_PART + key], out[_COMPLETION_PART + key] = value[:, :prompt_length], value[:, prompt_length:]
        else:
            out[key] = value
    return out


def join_spanning(rows: dict) -> dict:
    """The inverse of :func:`split_spanning`."""
    out = {key: value for key, value in rows.items() if not key.startswith((_PROMPT_PART, _COMPLETION_PART))}
    for key in SPANNING_KEYS:
        if _PROMPT_PART + key in rows:
            out[key] = torch.cat([rows[_PROMPT_PART + key], rows[_COMPLETION_PART + key]], dim=1)
    return out


def left_padded(key: str) -> bool:
    """Whether TRL pads the per-row tensor ``key`` on the left: prompts (and the prompt part of a spanning tensor);
    completions are padded on the right."""
    return key.startswith(_PROMPT_PART) or (key.startswith("prompt_") and ":" not in key)


def pad_value(key: str, pad_token_id: int) -> int:
    """The padding value of ``key``: the pad token for token ids, 0 for masks, log-probs, token-type ids (either part
    of a spanning tensor) and the rest."""
    if key.partition(":")[2] in SPANNING_KEYS or key in SPANNING_KEYS:
        return 0
    return pad_token_id if key.endswith("_ids") else 0


def stack_rows(
    batches: list[dict[str, torch.Tensor | list]], sources: list[tuple[int, int]], pad_token_id: int
) -> dict[str, torch.Tensor | list]:
    """Rows ``batches[b][key][i]`` for ``(b, i)`` in ``sources``, stacked per key and padded to a common length
    (left for prompts, right for completions). A key held as a list, one entry per row (a multimodal row's image
    patches, its image count), stays a list of the picked entries."""
    stacked = {}
    for key in batches[0]:
        picked = [batches[b][key][i] for b, i in sources]
        if isinstance(batches[0][key], list):
            stacked[key] = picked
            continue
        if picked[0].dim() == 0:
            stacked[key] = torch.stack(picked)
            continue
        length = max(row.shape[0] for row in picked)
        value = pad_value(key, pad_token_id)
        padded = []
        for row in picked:
            pad = [0] * (2 * (row.dim() - 1)) + (
                [length - row.shape[0], 0] if left_padded(key) else [0, length - row.shape[0]]
            )
            padded.append(torch.nn.functional.pad(row, pad, value=value))
        stacked[key] = torch.stack(padded)
    return stacked
