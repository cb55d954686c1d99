"""DPPO's top-K divergence on the trainer's side: the rollout distribution's top-K stored at generation time and the
current policy's log-probs at those ids in the loss, without a ``[B, T, vocab]`` tensor where the LM head allows.

:class:`TopKForward` is a part of :class:`trl_reasoning.trainer.base.ReasoningTrainer`, composed (``trainer.
topk_forward``): it reads the trainer only through :class:`TopKForwardHost` (the model, accelerator, config, the
bare-model cache and TRL's ``temperature`` and ``_tokenizer``) and, when vLLM generates, :class:`TopKEngineHost`
(TRL's ``vllm_generation``), both checked when a trainer is built; it overrides no TRL method. Three paths give the
rollout top-K:

- vLLM generates: the engine's own processed top-K log-probs (``keep_engine_topk`` wraps TRL's public
  ``VLLMGeneration.generate``; see ``TRL_VLLM_GENERATION`` in ``trainer/trl_api.py``);
- otherwise the training model's no-grad forward, from the final hidden states and the LM head in chunks
  (``trl_reasoning.algorithms.logprobs``), or from the logits when the hidden states do not reproduce them (a PEFT adapter on the
  LM head, an unusual output scaling): ``lm_head_from_hidden`` records the first failure and the logits path is kept
  from then.

A sharded LM head (DeepSpeed ZeRO-3 partitions, FSDP2 DTensors) is whole only inside the model's forward. There the
chunked head runs *as* the LM head module's forward for the duration of one call (``_head_inside_forward``): the
strategy gathers the weight before it and reduces its gradient after, as for any module, and the model hands back the
small ``[B, T, 2 + K]`` result in place of its logits.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

from ..algorithms.logprobs import (
    chunked_logps,
    chunked_logps_from_hidden,
    engine_sampled_logprobs,
    rollout_topk,
    rollout_topk_from_engine,
    rollout_topk_from_hidden,
)
from ..algorithms.losses import required_inputs
from ..algorithms.truncation import SamplingTruncation
from ..models.packing import PackedRows, PaddedRows
from ..models.varlen_attention import packed_forward
from ..utils.checkpointing import activation_checkpointing_disabled
from ..utils.user_warnings import user_stacklevel

# Per-row multimodal/auxiliary inputs that TRL forwards to the model in the loss.
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
#: Of those, the ones that are bookkeeping for slicing (how many images or tiles a row has), not model inputs.
_SLICING_ONLY_KEYS = ("num_images", "num_tiles")


def model_inputs(batch: dict, rows: slice | None = None) -> dict:
    """The multimodal inputs of ``batch`` (TRL's generation output or a micro-batch of it) that the model's forward
    takes, for the rows ``rows`` (all by default). Image-indexed tensors (``pixel_values`` by patch or tile,
    ``image_grid_thw`` by image, ...) are cut per row with TRL's own ``split_pixel_values_by_grid`` and joined back with
    ``unsplit_pixel_values_by_grid``, so every model family TRL supports is sliced as TRL slices it."""
    present = {key: batch[key] for key in FORWARD_KEYS if batch.get(key) is not None}
    if not present:
        return {}
    if rows is not None:
        per_row = split_pixel_values_by_grid(present)
        per_row = {
            key: value[rows] if isinstance(value, list) or (torch.is_tensor(value) and value.dim() > 0) else value
            for key, value in per_row.items()
        }
        present = unsplit_pixel_values_by_grid(per_row)
    return {key: value for key, value in present.items() if key not in _SLICING_ONLY_KEYS}


def _row_index(group: list[int]) -> slice | torch.Tensor:
    """Rows ``group`` as a slice where they are consecutive (multimodal inputs are cut by slices), else an index."""
    if group == list(range(group[0], group[-1] + 1)):
        return slice(group[0], group[-1] + 1)
    return torch.tensor(group)


def _as_index(rows: slice | torch.Tensor) -> torch.Tensor:
    return torch.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows


def uses_topk_divergence(args: Any) -> bool:
    """Whether the configured loss (``args.policy_loss``, ``args.dppo_divergence``) reads the rollout top-K."""
    return "rollout_topk_logps" in required_inputs(args.policy_loss, divergence=args.dppo_divergence)


@runtime_checkable
class TopKForwardHost(Protocol):
    """What :class:`TopKForward` reads from its trainer. Members from ``GRPOTrainer.__init__`` are in the TRL-API
    guard (``trl_reasoning.trainer.trl_api.TRL_INSTANCE_ATTRIBUTES``)."""

    # lent by trl-reasoning's trainer
    def _bare_model(self, model: torch.nn.Module | None = None) -> torch.nn.Module: ...

    # transformers.Trainer's
    args: Any
    accelerator: Any
    model: Any
    is_fsdp_enabled: bool

    # GRPOTrainer's (TRL_INSTANCE_ATTRIBUTES)
    temperature: float
    _tokenizer: Any


@runtime_checkable
class TopKEngineHost(Protocol):
    """:class:`TopKForward`'s members that ``GRPOTrainer`` sets only with ``use_vllm=True``
    (``TRL_VLLM_INSTANCE_ATTRIBUTES``): the engine whose own top-K DPPO keeps."""

    vllm_generation: Any
    vllm_mode: str


class TopKForward:
    """The rollout top-K and the loss-time top-K forward of DPPO's ``topk_tv`` / ``topk_kl`` divergences.

    A part of ``ReasoningTrainer`` (``trainer.topk_forward``); reads it only through :class:`TopKForwardHost` (and
    :class:`TopKEngineHost` when vLLM generates)."""

    def __init__(self, host: TopKForwardHost, packing: Any = None) -> None:
        self.host = host
        # the trainer's padding-free part (trainer/padding_free.py), or None: every forward padded
        self.packing = packing
        # The engine's top-K per generate call (None: not capturing; appended to by the asynchronous server
        # generator, through the trainer's ``_engine_topk``), and whether the LM head can still be applied to the
        # final hidden states (set False on the first failure).
        self.engine_topk: list[tuple[list, list, list]] | None = None
        self.lm_head_from_hidden: bool = True

    @property
    def uses_topk_divergence(self) -> bool:
        return uses_topk_divergence(self.host.args)

    def layout(self, model, input_ids, attention_mask, num_completion_tokens, extra_inputs=None):
        """How a forward of these rows runs: packed where the run packs (``PaddingFree.layout``), else padded."""
        if self.packing is None:
            return PaddedRows(input_ids, attention_mask, num_completion_tokens)
        return self.packing.layout(model, input_ids, attention_mask, num_completion_tokens, **(extra_inputs or {}))

    def row_groups(self, attention_mask, batch_size: int) -> list[list[int]]:
        """The rows of each no-grad forward: the padding-free groups where the run packs, else ``batch_size`` rows."""
        if self.packing is not None and self.packing.enabled:
            return self.packing.forward_groups(attention_mask, batch_size)
        rows = attention_mask.size(0)
        return [list(range(start, min(start + batch_size, rows))) for start in range(0, rows, batch_size)]

    def _run(self, model, rows, compute_aux_loss: bool, extra_inputs=None, **kwargs):
        """One model forward of ``rows`` (a padded or packed layout) under the accelerator's autocast."""
        if compute_aux_loss:
            kwargs["output_router_logits"] = True
        packing = packed_forward() if isinstance(rows, PackedRows) else contextlib.nullcontext()
        with self.host.accelerator.autocast(), packing:
            return model(**rows.model_inputs(), **kwargs, **(extra_inputs or {}))

    def _final_hidden_states(self, model, rows, compute_aux_loss, extra_inputs=None):
        """One forward that keeps logits for the last position only. Returns the final hidden states of the positions
        that predict the completion tokens (``rows.scoring_states``), the LM head as ``(weight, bias, logit_scale,
        softcap)`` (``None`` when the hidden states do not reproduce the model's logits: a PEFT adapter on the LM
        head, an unusual output scaling) and the model output (for the aux loss). ``rows``: the padded or packed
        layout (:meth:`layout`); ``extra_inputs``: the multimodal inputs of these rows (:func:`model_inputs`)."""
        out = self._run(model, rows, compute_aux_loss, extra_inputs, output_hidden_states=True, logits_to_keep=1)
        hidden = out.hidden_states[-1]
        head = self._lm_head_reproducing(model, hidden[:, -1:], out.logits[:, -1:])
        return rows.scoring_states(hidden), head, out

    def _lm_head_reproducing(self, model, last_hidden, last_logits):
        """The LM head as ``(weight, bias, logit_scale, softcap)`` when it is a plain linear layer (no adapter) and
        applying it to the last position's hidden state gives the model's logits there, else ``None``.

        The check is structural first (``torch.nn.Linear`` itself, an unsharded weight), then numeric at the
        precision of the model's own logits: recomputed from the same hidden state and weight, they differ from the
        model's by rounding alone (bfloat16 keeps 8 bits: a relative 2**-8), so the tolerance is a few units of the
        logits' dtype (an exact float32 check failed on every bfloat16 model and fell back to ``[B, T, V]`` logits). What the check exists to catch is far larger: a logit scale
        or soft-cap the model applies and the head does not, an adapter on the head."""
        head_module = self.host._bare_model(model).get_output_embeddings()
        text_config = self.host._bare_model(model).config.get_text_config()
        weight = getattr(head_module, "weight", None)
        # Only an unsharded head is applied here; a sharded one (ZeRO-3, FSDP) runs inside the forward instead
        # (_sharded_lm_head, checked first). Anything this check rejects takes the logits path.
        if not (isinstance(weight, torch.Tensor) and type(head_module) is torch.nn.Linear):
            return None
        scale = getattr(text_config, "logit_scale", None) or 1.0
        softcap = getattr(text_config, "final_logit_softcapping", None)
        with torch.no_grad():
            try:
                # in the weight's own dtype: a float32 copy of a [vocab, hidden] weight would be the step's largest
                # tensor (545 MiB for Qwen2.5-0.5B's)
                last = torch.nn.functional.linear(last_hidden.to(weight.dtype), weight, head_module.bias).float()
            except (RuntimeError, ValueError, TypeError):
                return None
            last = last * scale
            if softcap is not None:
                last = torch.tanh(last / softcap) * softcap
            reference = last_logits.float()
            if last.shape != reference.shape:
                return None
            # a few units in the last place of the logits' dtype (float32's 1e-3 as before, at least)
            relative = max(1e-3, 4 * torch.finfo(last_logits.dtype).eps)
            tolerance = relative * reference.abs().max().clamp(min=1).item()
            if not torch.allclose(last, reference, rtol=relative, atol=tolerance):
                return None
        return (weight, head_module.bias, float(scale), softcap)

    def _completion_logits(self, model, rows, compute_aux_loss, extra_inputs=None):
        """Fallback: the logits of the positions that predict the completion tokens (one ``[B, C, V]`` tensor, or
        ``[1, M, V]`` packed)."""
        out = self._run(model, rows, compute_aux_loss, extra_inputs, logits_to_keep=rows.positions_to_keep)
        return rows.scoring_states(out.logits), out

    def _sharded_lm_head(self, model) -> torch.nn.Module | None:
        """The LM head module when its weight is sharded outside the forward (a ZeRO-3 partition, an FSDP unit or
        DTensor) and the model's logits are the plain ``hidden @ W^T + b`` (no logit scale or soft-capping, which models apply
        after the head); else ``None``."""
        unwrapped = self.host._bare_model(model)
        module = unwrapped.get_output_embeddings()
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None:
            return None
        # ZeRO-3 parameters carry a ds_id; under FSDP the head is its own unit or part of the root's, whole only
        # between the unit's pre- and post-forward hooks (and its gradient reduced by the post-backward ones).
        sharded = hasattr(weight, "ds_id") or isinstance(weight, DTensor) or isinstance(module, FSDPModule)
        if not (sharded or getattr(self.host, "is_fsdp_enabled", False)):
            return None
        text_config = unwrapped.config.get_text_config()
        if (getattr(text_config, "logit_scale", None) or 1.0) != 1.0 or getattr(
            text_config, "final_logit_softcapping", None
        ):
            return None
        return module

    def _head_inside_forward(
        self,
        model,
        head: torch.nn.Module,
        head_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
        rows,
        compute_aux_loss: bool,
        extra_inputs: dict | None = None,
    ):
        """One model forward of ``rows`` (a padded or packed layout) in which ``head_fn(hidden, weight, bias)``
        replaces the LM head's own forward, ``hidden`` being the final hidden states that predict the completion
        tokens. Returns what ``head_fn`` returned (as the model's ``logits``) and the model output."""
        head.forward = lambda hidden: head_fn(rows.scoring_states(hidden), head.weight, head.bias)
        try:
            out = self._run(model, rows, compute_aux_loss, extra_inputs, logits_to_keep=rows.positions_to_keep)
        finally:
            del head.forward  # the class's forward again
        return out.logits, out

    @property
    def topk_size(self) -> int:
        vocab = self.host._bare_model().config.get_text_config().vocab_size
        return min(self.host.args.dppo_topk, vocab)

    def keep_engine_topk(self) -> None:
        """Make TRL's vLLM generation return the engine's top-``dppo_topk`` processed log-probs and keep them for
        :meth:`rollout_topk`, while TRL still receives what it expects: the sampled tokens' log-probs only.

        TRL asks vLLM for ``logprobs=0`` (the sampled token alone) and keeps entry 0 of each position; with
        ``logprobs=K`` entry 0 would be the most likely token instead, so the wrapper hands TRL the sampled token's
        entry (its importance-sampling correction and DPPO's ratio stay exact). Wraps the public
        ``VLLMGeneration.generate`` of this trainer's ``vllm_generation`` (an instance attribute, see
        ``TRL_VLLM_GENERATION``); nothing else of TRL changes. Untested against a real vLLM: the tests use a stand-in
        with vLLM's output shapes."""
        generation = self.host.vllm_generation
        generation.logprobs = self.topk_size
        generate = generation.generate
        self.engine_topk = []

        @functools.wraps(generate)
        def generate_keeping_topk(*args, **kwargs):
            prompt_ids, completion_ids, logprobs, logprob_token_ids = generate(*args, **kwargs)
            if logprobs is None or logprob_token_ids is None:
                raise RuntimeError(
                    "vLLM returned no log-probs, which DPPO's top-K divergence needs (dppo_divergence="
                    f"{self.host.args.dppo_divergence!r}); use 'binary_tv' or 'binary_kl', or a vLLM that returns them."
                )
            self.engine_topk.append((completion_ids, logprobs, logprob_token_ids))
            sampled = engine_sampled_logprobs(completion_ids, logprobs, logprob_token_ids)
            return (
                prompt_ids,
                completion_ids,
                [[[value] for value in seq] for seq in sampled],
                [[[token] for token in seq] for seq in completion_ids],
            )

        generation.generate = generate_keeping_topk
        if self.host.vllm_mode == "server" and self.host.accelerator.is_main_process:
            mode = generation.vllm_client.get_server_info()["model_config"]["logprobs_mode"]
            if mode != "processed_logprobs":
                warnings.warn(
                    f"The vLLM server runs with `--logprobs-mode {mode}`; DPPO's top-K divergence needs the "
                    "distribution the tokens were sampled from. Restart it with `--logprobs-mode processed_logprobs`.",
                    stacklevel=user_stacklevel(),
                )

    def _engine_rollout_topk(self, output) -> dict[str, torch.Tensor]:
        """The top-K vLLM reported for the completions of this round, padded like ``output["completion_ids"]``."""
        captured, self.engine_topk = self.engine_topk, []
        completion_ids = [seq for call in captured for seq in call[0]]
        ids, logps = rollout_topk_from_engine(
            completion_ids,
            [seq for call in captured for seq in call[1]],
            [seq for call in captured for seq in call[2]],
            k=self.topk_size,
            length=output["completion_ids"].size(1),
            pad_token_id=self.host._tokenizer.pad_token_id,
        )
        trained_ids, mask = output["completion_ids"], output["completion_mask"].bool()
        generated_ids = torch.full_like(trained_ids, self.host._tokenizer.pad_token_id)
        for row, seq in enumerate(completion_ids[: trained_ids.shape[0]]):
            generated_ids[row, : len(seq)] = torch.as_tensor(seq[: trained_ids.shape[1]])
        if len(completion_ids) != trained_ids.shape[0] or not torch.equal(generated_ids[mask], trained_ids[mask]):
            raise RuntimeError(
                "The completions TRL trained on are not the ones vLLM generated (tool calls or an environment "
                f"rewrote them); dppo_divergence={self.host.args.dppo_divergence!r} needs the engine's log-probs at every "
                "completion token. Use 'binary_tv' or 'binary_kl' here."
            )
        device = trained_ids.device
        return {"rollout_topk_ids": ids.to(device), "rollout_topk_logps": logps.to(device)}

    @torch.no_grad()
    def rollout_topk(self, output, mode: str) -> dict[str, torch.Tensor]:
        """The rollout policy's top-``dppo_topk`` token ids and log-probs at every completion position, sampled token
        swapped in (``[B, T, K]``).

        With vLLM these are vLLM's own processed log-probs, the distribution that sampled (see
        :meth:`keep_engine_topk`); otherwise the training model's own no-grad forward on the generation batch."""
        if self.engine_topk:  # empty when a custom rollout_func generated instead of vllm_generation.generate
            return self._engine_rollout_topk(output)
        completion_ids = output["completion_ids"]
        input_ids = torch.cat([output["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch_size = (
            self.host.args.per_device_train_batch_size
            if mode == "train"
            else self.host.args.per_device_eval_batch_size
        )
        k = self.topk_size
        ids = completion_ids.new_zeros(completion_ids.shape + (k,))
        logps = None
        sharded_head = self._sharded_lm_head(self.host.model) if self.lm_head_from_hidden else None
        with activation_checkpointing_disabled(self.host.model, self.host.args.gradient_checkpointing_kwargs):
            for group in self.row_groups(attention_mask, batch_size):
                rows = _row_index(group)
                chunk_ids, chunk_logps = self._rollout_topk_rows(
                    input_ids[rows],
                    attention_mask[rows],
                    completion_ids[rows],
                    sharded_head,
                    model_inputs(output, rows),
                )
                if logps is None:
                    logps = chunk_logps.new_zeros(completion_ids.shape + (k,))
                ids[rows], logps[rows] = chunk_ids, chunk_logps
        return {"rollout_topk_ids": ids, "rollout_topk_logps": logps}

    def _rollout_topk_rows(self, input_ids, attention_mask, completion_ids, sharded_head, extra_inputs=None):
        """The rollout top-K ``(ids, logps)`` ``[b, C, K]`` of some rows: LM head inside the forward (sharded head),
        on the final hidden states, or from the logits (the fallback). Packed, the positions that score nothing get
        id 0 and NaN log-probs, which the top-K divergence counts as no position."""
        found = []
        length = completion_ids.size(1)
        rows = self.layout(self.host.model, input_ids, attention_mask, length, extra_inputs)
        sampled = rows.scoring_targets(completion_ids)

        def topk_from_hidden(hidden, weight, bias, scale=1.0, softcap=None):
            found.append(
                rollout_topk_from_hidden(
                    hidden,
                    weight,
                    sampled,
                    k=self.host.args.dppo_topk,
                    temperature=self.host.temperature,
                    lm_head_bias=bias,
                    logit_scale=scale,
                    final_logit_softcapping=softcap,
                )
            )
            return hidden.new_zeros(hidden.shape[:2] + (1,))  # the model's "logits" when run inside it: unused

        extra = None if isinstance(rows, PackedRows) else extra_inputs
        if sharded_head is not None:
            self._head_inside_forward(self.host.model, sharded_head, topk_from_hidden, rows, False, extra)
        else:
            head = None
            if self.lm_head_from_hidden:
                hidden, head, _ = self._final_hidden_states(self.host.model, rows, False, extra)
                self.lm_head_from_hidden = head is not None
            if head is not None:
                topk_from_hidden(hidden, *head)
            else:
                logits, _ = self._completion_logits(self.host.model, rows, False, extra)
                found.append(
                    rollout_topk(logits, sampled, k=self.host.args.dppo_topk, temperature=self.host.temperature)
                )
        ids, logps = found[0]
        return rows.restore(ids, fill=0), rows.restore(logps, fill=math.nan)

    def forward(
        self,
        model,
        input_ids,
        attention_mask,
        completion_ids,
        topk_ids,
        compute_aux_loss,
        extra_inputs=None,
        truncation: SamplingTruncation | None = None,
    ):
        """The current policy's sampled-token log-probs (with gradient), entropies, log-probs at the stored top-K ids
        (with gradient; ``topk_ids=None``: none) and MoE aux loss, chunked over positions so no ``[B, T, V]`` tensor
        is built when the LM head can be applied to the hidden states (otherwise one: the logits). Packed where the run
        packs (only the positions that predict a completion token reach the LM head), the outputs in the padded
        ``[B, C]`` layout. ``extra_inputs``: the rows' multimodal inputs (:func:`model_inputs`). ``truncation``: scored
        on the sampler's truncated support (``trl_reasoning.algorithms.truncation``; not with ``topk_ids``)."""
        rows = self.layout(model, input_ids, attention_mask, completion_ids.size(1), extra_inputs)
        extra = None if isinstance(rows, PackedRows) else extra_inputs
        sampled = rows.scoring_targets(completion_ids)
        topk = None if topk_ids is None else rows.scoring_targets(topk_ids)
        head = None
        sharded_head = self._sharded_lm_head(model) if self.lm_head_from_hidden else None
        if sharded_head is not None:
            logps, entropies, topk_logps, out = self._forward_sharded_head(
                model, sharded_head, rows, sampled, topk, compute_aux_loss, extra, truncation
            )
        else:
            if self.lm_head_from_hidden:
                hidden, head, out = self._final_hidden_states(model, rows, compute_aux_loss, extra)
                self.lm_head_from_hidden = head is not None
            if head is not None:
                weight, bias, scale, softcap = head
                logps, entropies, topk_logps = chunked_logps_from_hidden(
                    hidden,
                    weight,
                    sampled,
                    topk,
                    temperature=self.host.temperature,
                    lm_head_bias=bias,
                    logit_scale=scale,
                    final_logit_softcapping=softcap,
                    truncation=truncation,
                )
            else:
                logits, out = self._completion_logits(model, rows, compute_aux_loss, extra)
                logps, entropies, topk_logps = chunked_logps(
                    logits, sampled, topk, temperature=self.host.temperature, truncation=truncation
                )
        aux_loss = out.aux_loss if compute_aux_loss else None
        topk_logps = None if topk_logps is None else rows.restore(topk_logps)
        return rows.restore(logps), rows.restore(entropies), topk_logps, aux_loss

    def _forward_sharded_head(
        self,
        model,
        sharded_head,
        rows,
        sampled,
        topk,
        compute_aux_loss,
        extra_inputs,
        truncation: SamplingTruncation | None,
    ):
        """:meth:`forward` when the LM head is sharded (FSDP2, ZeRO-3): the chunked log-probs run inside the
        model's forward, on the gathered head, and come back packed as one tensor. Returns the log-probs, entropies
        and top-K log-probs in the layout of ``rows.scoring_states``, and the model output."""

        def packed_logps(hidden, weight, bias):
            logps, entropies, topk_logps = chunked_logps_from_hidden(
                hidden,
                weight,
                sampled,
                topk,
                temperature=self.host.temperature,
                lm_head_bias=bias,
                truncation=truncation,
            )
            # One output tensor, so the strategy's backward hooks on the head's output see all of it.
            parts = [logps.unsqueeze(-1), entropies.unsqueeze(-1).to(logps.dtype)]
            return torch.cat(parts if topk_logps is None else [*parts, topk_logps], dim=-1)

        packed, out = self._head_inside_forward(
            model, sharded_head, packed_logps, rows, compute_aux_loss, extra_inputs
        )
        topk_logps = packed[..., 2:] if topk is not None else None
        return packed[..., 0], packed[..., 1].detach(), topk_logps, out

    def logps_on_sampling_support(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
        compute_aux_loss: bool,
        forward_inputs: dict,
        truncation: SamplingTruncation,
    ):
        """TRL's ``_get_per_token_logps_and_entropies`` (same arguments, same outputs, rows in chunks of
        ``batch_size``) with the log-probs and entropies of the sampler's truncated distribution: the temperature,
        then ``truncation``, applied to the model's own logits and renormalised, chunked over positions (no
        ``[B, T, V]`` tensor where the LM head can be applied to the hidden states).

        Why the policy's *own* support and not the one the sampler used: at lag 0 they are the same set (the same
        logits), so ``pi_S / mu_S`` is exactly 1; later, ``pi_S`` is the distribution the current policy samples
        from, which is what the importance weight ``pi_S / mu_S`` must correct towards, and it needs nothing stored
        from generation (vLLM does not return its support, a top-p support can be most of the vocabulary). The
        sampled token is always kept in the support, so a token the current policy would no longer sample gets a
        small, finite log-prob (a small ratio, which the clipping and TRL's correction treat as such) instead of
        ``-inf``. The support is held fixed under the gradient (it is piecewise constant in the logits): the
        gradient of ``log pi_S(y)`` is ``e_y - p_S``, the baseline being the truncated distribution's mean, and the
        tokens outside the support get none; TRL's full-vocabulary gradient ``e_y - p`` also pushes down every
        token the sampler can never draw."""
        present = {key: value for key, value in forward_inputs.items() if value is not None}
        completion_ids = input_ids[:, -logits_to_keep:]
        groups = self.row_groups(attention_mask, batch_size or input_ids.size(0))
        logps = entropies = None
        aux_losses = []
        for group in groups:
            rows = _row_index(group)
            chunk_logps, chunk_entropies, _, aux_loss = self.forward(
                model,
                input_ids[rows],
                attention_mask[rows],
                completion_ids[rows],
                None,
                compute_aux_loss,
                model_inputs(present, rows),
                truncation=truncation,
            )
            if len(groups) == 1:
                logps, entropies = chunk_logps, chunk_entropies
            else:
                if logps is None:
                    logps = chunk_logps.new_zeros(completion_ids.shape)
                    entropies = chunk_entropies.new_zeros(completion_ids.shape)
                logps, entropies = (
                    logps.index_put((_as_index(rows),), chunk_logps),
                    entropies.index_put((_as_index(rows),), chunk_entropies),
                )
            aux_losses.append(aux_loss)
        aux_loss = torch.stack(aux_losses).mean() if compute_aux_loss else None
        return logps, entropies if compute_entropy else None, aux_loss
