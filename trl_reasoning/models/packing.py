"""Padding-free batches: the real tokens of padded rows laid end to end in one row, and the way back.

Knows torch, not TRL or the trainer. A GRPO batch is ``[B, L]`` token ids (prompts padded on the left, completions on
the right) with an attention mask; most of a ragged batch is padding. :func:`pack_rows` keeps only the tokens whose
mask is 1, one sequence after another in a single ``[1, T]`` row, with position ids that restart at 0 for each
sequence and the cumulative sequence lengths a variable-length attention needs (``cu_seq_lens``, flash-attention's
convention). It also says, for every completion token of the padded batch, which packed position predicts it, so a
per-position result of the packed forward (a log-prob, an entropy, a hidden state) can be put back in the padded
``[B, C]`` layout the loss reads (:meth:`PackedRows.unpack`).

Exactness. The padded forward's value at a real token depends on that token's sequence only (the attention mask
hides the padding), and rotary position embeddings depend on positions only through their differences, so the
packed forward computes the same numbers up to floating-point rounding. Two layouts have no packed twin and are
refused by :func:`packable` (the caller keeps the padded forward): a row whose real tokens are not one contiguous
run (a hole in the mask moves every later token's position), and a row whose first real token is a scored
completion token (the padded forward predicts it from a padding position).

:func:`token_budget_groups` and :func:`balanced_groups` split rows into forwards by their real token counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: The label of a position that predicts nothing (the fused LM head's and the loss's ignore index).
IGNORE_INDEX = -100


@dataclass(frozen=True)
class PackedRows:
    """Some rows of a padded batch, packed into one row.

    Attributes:
        rows: ``[n]`` the padded batch's row of each packed sequence, in packing order (rows without any real token
            are left out).
        input_ids: ``[1, T]`` the real tokens of those rows, end to end.
        position_ids: ``[1, T]`` each token's position in its own sequence (0, 1, ... restarting per sequence).
        cu_seq_lens: ``[n + 1]`` int32, the cumulative sequence lengths (0 first).
        max_length: the longest packed sequence.
        shift_labels: ``[1, T]`` at each packed position, the id of the completion token it predicts (the next
            token of the same sequence, inside the last ``num_scored`` columns of the padded batch and real), else
            :data:`IGNORE_INDEX`.
        scored_positions: ``[M]`` the packed positions that predict a completion token (where ``shift_labels`` is
            not ignored), in packing order.
        scored_rows, scored_columns: ``[M]`` where each of them goes in the padded ``[B, num_scored]`` layout.
        batch_size, num_scored: the padded layout's ``B`` and ``C``.
    """

    rows: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    shift_labels: torch.Tensor
    scored_positions: torch.Tensor
    scored_rows: torch.Tensor
    scored_columns: torch.Tensor
    batch_size: int
    num_scored: int

    @property
    def num_tokens(self) -> int:
        """``T``, the real tokens in the pack."""
        return self.input_ids.size(1)

    def attention_kwargs(self) -> dict[str, torch.Tensor | int]:
        """The keyword arguments a transformers model forwards to its attention for variable-length sequences
        (flash-attention's names, which ``trl_reasoning.models.varlen_attention`` reads too)."""
        return {
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }

    def scored(self, packed: torch.Tensor) -> torch.Tensor:
        """The values at the scored positions of a packed ``[1, T, ...]`` result: ``[M, ...]``."""
        return packed[0, self.scored_positions]

    def unpack(self, packed: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """A packed per-position result ``[1, T, ...]`` in the padded layout ``[B, num_scored, ...]``: each
        completion token's value at its place, ``fill`` where nothing predicted one (padding, prompts, masked
        completions, rows of other packs). Differentiable in ``packed``."""
        return self.unpack_scored(self.scored(packed), fill)

    def unpack_scored(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """:meth:`unpack` of the scored positions' values alone, ``[M, ...]`` in packing order."""
        out = values.new_full((self.batch_size, self.num_scored, *values.shape[1:]), fill)
        return out.index_put((self.scored_rows, self.scored_columns), values)

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """The scored positions' entries of a padded ``[B, num_scored, ...]`` tensor, in packing order: ``[M, ...]``
        (the inverse of :meth:`unpack_scored`)."""
        return padded[self.scored_rows, self.scored_columns]

    # The layout protocol shared with PaddedRows: a forward that scores the completion tokens reads these.
    def model_inputs(self) -> dict[str, torch.Tensor | int]:
        """The token inputs of a forward of the pack."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, **self.attention_kwargs()}

    #: ``logits_to_keep`` for a forward whose every position may be scored (0: all).
    positions_to_keep = 0

    def scoring_states(self, per_position: torch.Tensor) -> torch.Tensor:
        """The entries of a ``[1, T, ...]`` per-position output at the positions that predict completion tokens:
        ``[1, M, ...]``."""
        return per_position[:, self.scored_positions]

    def scoring_targets(self, padded: torch.Tensor) -> torch.Tensor:
        """The entries of a padded ``[B, num_scored, ...]`` input (the sampled ids, the stored top-K ids) at the
        scored positions: ``[1, M, ...]``, aligned with :meth:`scoring_states`."""
        return self.gather(padded).unsqueeze(0)

    def restore(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``[1, M, ...]`` values aligned with :meth:`scoring_states` back in the padded layout ``[B, C, ...]``."""
        return self.unpack_scored(values[0], fill)


@dataclass(frozen=True)
class PaddedRows:
    """The padded batch itself, with :class:`PackedRows`' layout protocol: the padded forward of TRL.

    Attributes:
        input_ids, attention_mask: ``[B, L]``.
        num_scored: the completion columns at the right end whose tokens are scored.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    num_scored: int

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    @property
    def positions_to_keep(self) -> int:
        return self.num_scored + 1

    def scoring_states(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[B, C, ...]``: the positions just before each completion column (the last ``C + 1`` but one)."""
        start = per_position.size(1) - self.num_scored - 1
        return per_position[:, start:-1]

    def scoring_targets(self, padded: torch.Tensor) -> torch.Tensor:
        return padded

    def restore(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        return values


def packable(attention_mask: torch.Tensor, num_scored: int) -> str | None:
    """Why the rows of ``attention_mask`` ``[B, L]`` have no exact packed twin, or ``None`` when they do.

    Each row's real tokens must be one contiguous run (left padding, tokens, right padding), and a scored completion
    token (one of the last ``num_scored`` columns) must not be its row's first real token."""
    mask = attention_mask.bool()
    if mask.dim() != 2:
        return f"the attention mask has {mask.dim()} dimensions, not 2"
    lengths = mask.sum(dim=1)
    columns = torch.arange(mask.size(1), device=mask.device)
    first = torch.where(mask, columns, mask.size(1)).amin(dim=1)
    last = torch.where(mask, columns, -1).amax(dim=1)
    holes = (lengths > 0) & (last - first + 1 != lengths)
    if bool(holes.any()):
        return f"row {int(holes.nonzero()[0])} has padding between its real tokens"
    starts_scored = (lengths > 0) & (first >= mask.size(1) - num_scored)
    if bool(starts_scored.any()):
        return f"row {int(starts_scored.nonzero()[0])} has no prompt token before its completion"
    return None


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_scored: int,
    rows: torch.Tensor | Sequence[int] | None = None,
) -> PackedRows:
    """Pack the real tokens of ``rows`` (all by default) of the padded batch ``input_ids`` ``[B, L]``.

    ``num_scored`` is the number of completion columns at the right end of the padded batch whose tokens are scored
    (TRL's ``logits_to_keep``). The caller checks :func:`packable` first.
    """
    batch, length = input_ids.shape
    device = input_ids.device
    if rows is None:
        rows = torch.arange(batch, device=device)
    rows = torch.as_tensor(rows, dtype=torch.long, device=device)
    mask = attention_mask[rows].bool()
    lengths = mask.sum(dim=1)
    rows, mask, lengths = rows[lengths > 0], mask[lengths > 0], lengths[lengths > 0]
    tokens = input_ids[rows][mask]
    total = tokens.numel()
    cu_seq_lens = torch.zeros(len(rows) + 1, dtype=torch.int32, device=device)
    cu_seq_lens[1:] = lengths.cumsum(0)
    # which packed sequence each token belongs to, and so its position in that sequence
    sequence = torch.repeat_interleave(torch.arange(len(rows), device=device), lengths)
    position_ids = torch.arange(total, device=device) - cu_seq_lens[:-1].long()[sequence]
    # the padded column of each packed token: a completion token (column >= length - num_scored) that is not its
    # sequence's first is predicted by the packed position just before it
    columns = torch.arange(length, device=device).expand_as(mask)[mask]
    predicted = (columns >= length - num_scored) & (position_ids > 0)
    targets = predicted.nonzero().squeeze(1)
    shift_labels = torch.full((total,), IGNORE_INDEX, dtype=input_ids.dtype, device=device)
    shift_labels[targets - 1] = tokens[targets]
    return PackedRows(
        rows=rows,
        input_ids=tokens.unsqueeze(0),
        position_ids=position_ids.unsqueeze(0),
        cu_seq_lens=cu_seq_lens,
        max_length=int(lengths.max()) if len(rows) else 0,
        shift_labels=shift_labels.unsqueeze(0),
        scored_positions=targets - 1,
        scored_rows=rows[sequence[targets]],
        scored_columns=columns[targets] - (length - num_scored),
        batch_size=batch,
        num_scored=num_scored,
    )


def token_budget_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive groups of row indices whose token counts ``lengths`` sum to at most ``budget`` each (a row longer
    than the budget is a group of its own). Rows keep their order; every row is in exactly one group."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for row, count in enumerate(lengths):
        if current and tokens + count > budget:
            groups.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += count
    if current:
        groups.append(current)
    return groups


def balanced_groups(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Row indices split into exactly ``parts`` non-empty groups (``parts <= len(lengths)``) whose token counts are as
    even as the greedy longest-first rule makes them: each row, longest first, joins the group with the fewest tokens
    so far (ties: the group with fewer rows, then the lower index). Rows are sorted inside each group; the groups are
    ordered by their first row. Deterministic."""
    if not 1 <= parts <= max(len(lengths), 1):
        raise ValueError(f"parts must be between 1 and the number of rows ({len(lengths)}), got {parts}")
    groups: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    for placed, row in enumerate(order):
        # the last rows go to groups still empty, so every group gets one
        empty = [index for index in range(parts) if not groups[index]]
        if len(empty) >= len(order) - placed:
            target = empty[0]
        else:
            target = min(range(parts), key=lambda index: (totals[index], len(groups[index]), index))
        groups[target].append(row)
        totals[target] += lengths[row]
    return sorted((sorted(group) for group in groups if group), key=lambda group: group[0])
