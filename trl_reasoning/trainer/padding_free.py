"""Padding-free forwards (``padding_free``): every forward of a step runs on the real tokens only.

:class:`PaddingFree` is a part of :class:`trl_reasoning.trainer.base.ReasoningTrainer`, composed
(``trainer.padding_free``); it reads the trainer only through :class:`PaddingFreeHost`. When the trainer is built it
decides whether the run packs (``args.padding_free``: ``None`` packs wherever the packed forward is exact, ``True``
refuses a run where it is not, ``False`` never packs) and gives the policy (and a separate reference model) the
attention that keeps packed sequences apart (``trl_reasoning.models.varlen_attention``).

Then :meth:`PaddingFree.logps_and_entropies` stands in for TRL's ``_get_per_token_logps_and_entropies`` (the same
arguments and outputs) on every forward TRL or this package runs through it: the loss's, ``pi_old``'s, the
reference's, the behaviour policy's. The rows are packed (``trl_reasoning.models.packing``) into forwards that hold at
most ``padding_free_token_budget`` real tokens each (the loss's forward: the whole micro-batch in one), the model's
fused LM head (TRL's ``add_fused_lm_head``) scores the packed positions through ``shift_labels``, and the log-probs
and entropies come back in the padded ``[B, C]`` layout, zero where TRL's are zero. DPPO's top-K forward packs with
the same layouts (``trainer.topk_forward``).

Under DeepSpeed ZeRO-3 or FSDP every process must run the same number of forwards (each gathers the sharded weights
with the others), so there the rows are split into as many forwards as TRL's row chunks, balanced by tokens.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol, runtime_checkable

import torch

from ..algorithms.aggregation import AGGREGATIONS
from ..models.lm_head import unwrap_peft
from ..models.packing import PackedRows, PaddedRows, balanced_groups, pack_rows, packable, token_budget_groups
from ..models.varlen_attention import (
    PackedAttentionUnsupported,
    install,
    packed_forward,
    reads_packed_sequences,
    uninstall,
    unsupported_reason,
)
from ..utils.user_warnings import user_stacklevel


@runtime_checkable
class PaddingFreeHost(Protocol):
    """What :class:`PaddingFree` reads from its trainer. Members from ``GRPOTrainer.__init__`` are in the TRL-API
    guard (``trl_reasoning.trainer.trl_api.TRL_INSTANCE_ATTRIBUTES``)."""

    # lent by trl-reasoning's trainer
    def _bare_model(self, model: torch.nn.Module | None = None) -> torch.nn.Module: ...

    # transformers.Trainer's
    args: Any
    accelerator: Any
    model: Any
    is_fsdp_enabled: bool
    is_deepspeed_enabled: bool

    # GRPOTrainer's (TRL_INSTANCE_ATTRIBUTES)
    ref_model: Any
    _is_vlm: bool


def unpackable_model_reason(model: torch.nn.Module, is_vlm: bool) -> str | None:
    """Why the packed forward of ``model`` would not equal its padded one, or ``None``."""
    base = unwrap_peft(model)
    if is_vlm or base.config.get_text_config() is not base.config:
        return "a vision-language model (its image tokens and position ids are laid out per row)"
    backbone = getattr(base, base.base_model_prefix, None)
    if backbone is None or getattr(backbone, "rotary_emb", None) is None:
        return (
            f"{type(base).__name__} has no rotary position embeddings (packed positions restart at 0 for each "
            "sequence, where its padded forward counts the padding)"
        )
    return unsupported_reason(base)


class PaddingFree:
    """The packed forwards of a trainer. ``enabled`` says whether the run packs; ``reason`` why it does not."""

    def __init__(self, host: PaddingFreeHost) -> None:
        self.host = host
        requested = host.args.padding_free
        self.reason: str | None = "padding_free=False" if requested is False else None
        if requested is not False:
            self.reason = self._model_reason()
            if self.reason is not None and requested:
                raise ValueError(f"padding_free=True cannot pack this run: {self.reason}. Set padding_free=False.")
        if self.reason is None:
            try:
                for model in self._models():
                    install(unwrap_peft(model))
            except PackedAttentionUnsupported as error:
                for model in self._models():
                    uninstall(unwrap_peft(model))
                if requested:
                    raise ValueError(
                        f"padding_free=True cannot pack this run: {error}. Set padding_free=False."
                    ) from error
                self.reason = str(error)
        self.enabled = self.reason is None
        # the first layout that had no packed twin is said once (the padded forward runs there instead)
        self._warned_layout = False

    def _models(self) -> list[torch.nn.Module]:
        return [model for model in (self.host.model, self.host.ref_model) if model is not None]

    def _model_reason(self) -> str | None:
        for model in self._models():
            reason = unpackable_model_reason(model, self.host._is_vlm)
            if reason is not None:
                return reason
        return None

    def layout(
        self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_scored: int, **extra
    ) -> PackedRows | PaddedRows:
        """How a forward of these rows runs: packed, or padded where packing is off, the model's attention would not
        keep the sequences apart (it was changed after the trainer was built), multimodal inputs come with the rows,
        or the mask has no packed twin (``models.packing.packable``, said once)."""
        if not self.packs(model, attention_mask, num_scored, **extra):
            return PaddedRows(input_ids, attention_mask, num_scored)
        return pack_rows(input_ids, attention_mask, num_scored)

    def packs(self, model: torch.nn.Module, attention_mask: torch.Tensor, num_scored: int, **extra) -> bool:
        """Whether a forward of these rows runs packed (:meth:`layout`)."""
        if not self.enabled or any(value is not None for value in extra.values()):
            return False
        if not reads_packed_sequences(unwrap_peft(self.host._bare_model(model))):
            return False
        problem = packable(attention_mask, num_scored)
        if problem is not None and not self._warned_layout:
            self._warned_layout = True
            warnings.warn(
                f"padding_free: this batch is scored padded ({problem}).", UserWarning, stacklevel=user_stacklevel()
            )
        return problem is None

    def forward_groups(self, attention_mask: torch.Tensor, batch_size: int | None) -> list[list[int]]:
        """The rows of each packed forward: all of them in one without a ``batch_size`` (the loss's forward, as TRL
        runs it); else at most ``padding_free_token_budget`` real tokens a forward (default: ``batch_size`` rows of the
        padded length, the padded forward's own bound), or, where every process must run as many forwards as the
        others (ZeRO-3, FSDP), TRL's number of row chunks balanced by tokens."""
        rows = attention_mask.size(0)
        if batch_size is None or batch_size >= rows:
            return [list(range(rows))]
        lengths = attention_mask.sum(dim=1).tolist()
        if self._sharded():
            return balanced_groups(lengths, math.ceil(rows / batch_size))
        budget = self.host.args.padding_free_token_budget or batch_size * attention_mask.size(1)
        return token_budget_groups(lengths, budget)

    def _sharded(self) -> bool:
        host = self.host
        if host.accelerator.num_processes < 2:
            return False
        zero_stage = getattr(getattr(host.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
        return bool(host.is_fsdp_enabled or (host.is_deepspeed_enabled and zero_stage == 3))

    def logps_and_entropies(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **forward_inputs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
        """TRL's ``_get_per_token_logps_and_entropies`` on packed rows: ``(logps [B, C], entropies [B, C] or None,
        aux loss or None)``, or ``None`` where these rows run padded (:meth:`layout`; ``forward_inputs``: TRL's
        multimodal inputs, which keep a batch padded)."""
        if not self.packs(model, attention_mask, logits_to_keep, **forward_inputs):
            return None
        rows_, columns, logps, entropies, aux_losses = [], [], [], [], []
        for group in self.forward_groups(attention_mask, batch_size):
            packed = pack_rows(input_ids, attention_mask, logits_to_keep, group)
            out = self._fused_forward(model, packed, compute_aux_loss)
            rows_.append(packed.scored_rows)
            columns.append(packed.scored_columns)
            logps.append(packed.scored(out.log_probs))
            if compute_entropy:
                entropies.append(packed.scored(out.entropy))
            if compute_aux_loss:
                aux_losses.append(out.aux_loss)
        index = (torch.cat(rows_), torch.cat(columns))
        shape = (input_ids.size(0), logits_to_keep)
        per_token_logps = logps[0].new_zeros(shape).index_put(index, torch.cat(logps))
        per_token_entropies = (
            entropies[0].new_zeros(shape).index_put(index, torch.cat(entropies)) if compute_entropy else None
        )
        aux_loss = torch.stack(aux_losses).mean() if compute_aux_loss else None
        return per_token_logps, per_token_entropies, aux_loss

    def balanced(self, micro_batches: list[dict]) -> list[dict]:
        """A fresh generation batch's micro-batches (TRL's ``_buffered_inputs``) rebalanced by real tokens within
        each optimizer step (:func:`token_balanced_micro_batches`) where the run packs and its aggregation is fixed on
        the whole batch (not TRL's per-micro-batch ``bnpo``, whose gradient depends on the split); else unchanged."""
        args = self.host.args
        if not self.enabled or AGGREGATIONS.traits(args.loss_aggregation).per_micro_batch:
            return micro_batches
        return token_balanced_micro_batches(micro_batches, args.gradient_accumulation_steps)

    def _fused_forward(self, model: torch.nn.Module, packed: PackedRows, compute_aux_loss: bool):
        """One forward of a pack through the model's fused LM head (TRL's ``add_fused_lm_head``)."""
        kwargs = {"output_router_logits": True} if compute_aux_loss else {}
        try:
            with self.host.accelerator.autocast(), packed_forward():
                return model(**packed.model_inputs(), shift_labels=packed.shift_labels, fused_lm_head=True, **kwargs)
        except PackedAttentionUnsupported as error:
            raise ValueError(f"padding_free: {error}. Set padding_free=False.") from error


def token_balanced_micro_batches(micro_batches: list[dict], per_step: int) -> list[dict]:
    """TRL's micro-batches of one generation batch (``_prepare_inputs``' buffer: equal row counts, in order), their
    rows redistributed so that the ``per_step`` micro-batches of each optimizer step hold about as many real tokens
    (``prompt_mask`` plus ``completion_mask``) as each other (``models.packing.balanced_groups``).

    Rows only move between micro-batches of the same optimizer step, whose gradients the step sums with weights
    fixed on the whole batch (``loss_weights``), so each optimizer step's gradient is unchanged; what changes is that
    no packed forward is a long one beside short ones. Tensors (and lists) of one entry per row move with their row;
    scalars and ``None`` are kept as they are. A micro-batch list that does not split into whole optimizer steps, or
    whose rows carry images (their tensors are not one entry per row), is returned unchanged."""
    if per_step < 2 or len(micro_batches) % per_step or any("pixel_values" in batch for batch in micro_batches):
        return micro_batches
    balanced: list[dict] = []
    for start in range(0, len(micro_batches), per_step):
        step = micro_batches[start : start + per_step]
        rows = [row for batch in step for row in range(len(batch["prompt_mask"]))]
        if len(rows) < per_step:
            return micro_batches
        merged = {key: _joined([batch[key] for batch in step]) for key in step[0]}
        lengths = (merged["prompt_mask"].sum(dim=1) + merged["completion_mask"].sum(dim=1)).tolist()
        for group in balanced_groups(lengths, per_step):
            index = torch.tensor(group)
            balanced.append({key: _rows_of(value, index) for key, value in merged.items()})
    return balanced


def _joined(values: list) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat(values)
    if isinstance(first, list):
        return [item for value in values for item in value]
    return first  # a scalar or None: the same in every micro-batch


def _rows_of(value: Any, index: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value[index.to(value.device)]
    if isinstance(value, list):
        return [value[row] for row in index.tolist()]
    return value
