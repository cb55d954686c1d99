"""Attention over packed sequences (``trl_reasoning.models.packing``) for models that run ``sdpa`` or ``eager``.

Knows torch and transformers' attention registry, not TRL. A packed forward hands the model one ``[1, T]`` row holding
several sequences, with their cumulative lengths (``cu_seq_lens_q``/``_k``, ``max_length_q``/``_k``: flash-attention's
keyword arguments, which every transformers model passes on to its attention function). The flash-attention
implementations read them natively. ``sdpa`` and ``eager`` ignore them and would let each sequence attend to the ones
packed before it, so :func:`install` gives such a model an attention implementation of its own, registered with
transformers' ``AttentionInterface`` as ``trl_reasoning_packed_<base>``:

- without those keyword arguments (generation, any unpacked forward) it *is* the base implementation: the same
  function, the same mask;
- with them, each sequence attends causally to itself only, and the mask transformers would build for the packed row
  (a dense ``[T, T]`` block-diagonal matrix, quadratic in the *total* tokens) is never built: the cost is that of the
  sequences one by one. On a CUDA device in half precision PyTorch's variable-length flash kernel
  (``torch.nn.attention.varlen.varlen_attn``) runs all sequences in one call where it exists; elsewhere
  ``scaled_dot_product_attention`` runs once per sequence.

Sliding windows (Mistral, Qwen2 with ``use_sliding_window``) and attention soft-capping (Gemma 2) are kept. Attention
sinks (``s_aux``, gpt-oss) and position biases are not: such a forward raises :class:`PackedAttentionUnsupported`.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import sys
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn

#: Prefix of the implementations registered here; the base implementation's name follows it.
PACKED_PREFIX = "trl_reasoning_packed_"
#: Base implementations this module wraps. The flash-attention ones read packed sequences natively.
WRAPPED_BASES = ("sdpa", "eager")
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")

# The first failure of PyTorch's varlen kernel, after which the per-sequence path is taken.
_FLASH_VARLEN_FAILED: list[BaseException] = []
# True while a packed forward builds its masks: the packed implementations then return no mask.
_PACKING = contextvars.ContextVar("trl_reasoning_packing", default=False)


class PackedAttentionUnsupported(RuntimeError):
    """The model's attention takes an input the packed path does not reproduce (attention sinks, a position bias)."""


def base_implementation(model: nn.Module) -> str:
    """The attention implementation ``model`` runs, with this module's wrapper taken off."""
    name = model.config._attn_implementation or "eager"
    return name[len(PACKED_PREFIX) :] if name.startswith(PACKED_PREFIX) else name


def reads_packed_sequences(model: nn.Module) -> bool:
    """Whether a forward of ``model`` given ``cu_seq_lens_*`` keeps each packed sequence to itself."""
    name = model.config._attn_implementation or "eager"
    return name.startswith(PACKED_PREFIX) or name in NATIVE_VARLEN


def unsupported_reason(model: nn.Module) -> str | None:
    """Why packed sequences cannot run through ``model``'s attention, or ``None``."""
    base = base_implementation(model)
    if base in NATIVE_VARLEN or base in WRAPPED_BASES:
        return None
    return f"its attention implementation {base!r} is none of {', '.join(WRAPPED_BASES + NATIVE_VARLEN)}"


def install(model: nn.Module) -> None:
    """Make ``model`` (a transformers ``PreTrainedModel``) keep packed sequences apart: a flash-attention model as it
    is; an ``sdpa`` or ``eager`` one through this module's wrapper of the same base (which changes nothing for an
    unpacked forward). Not written to a saved ``config.json``: transformers keeps the implementation out of it."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise PackedAttentionUnsupported(f"{type(model).__name__}: {reason}")
    base = base_implementation(model)
    if base in NATIVE_VARLEN:
        return
    name = _register(base)
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    if model.config._attn_implementation != name:  # transformers declines for a model that does not dispatch it
        raise PackedAttentionUnsupported(
            f"{type(model).__name__} does not dispatch its attention through transformers' AttentionInterface"
        )


def uninstall(model: nn.Module) -> None:
    """Give ``model`` its base implementation back."""
    name = model.config._attn_implementation or ""
    if name.startswith(PACKED_PREFIX):
        model.set_attn_implementation(base_implementation(model))


@contextlib.contextmanager
def packed_forward() -> Iterator[None]:
    """Around a packed forward: the packed implementations build no attention mask inside it."""
    token = _PACKING.set(True)
    try:
        yield
    finally:
        _PACKING.reset(token)


def _register(base: str) -> str:
    """Register the packed twin of ``base`` (attention and mask) once; its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PACKED_PREFIX + base
    if name not in AttentionInterface._global_mapping:
        base_mask = ALL_MASK_ATTENTION_FUNCTIONS[base]

        def mask(*args, **kwargs):
            return None if _PACKING.get() else base_mask(*args, **kwargs)

        AttentionInterface.register(name, _attention_function(base))
        AttentionMaskInterface.register(name, mask)
    return name


def _attention_function(base: str) -> Callable:
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if kwargs.get("cu_seq_lens_q") is None:
            return _base_function(base, module)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        return packed_attention(module, query, key, value, dropout=dropout, scaling=scaling, **kwargs), None

    return attention


def _base_function(base: str, module: nn.Module) -> Callable:
    """The base implementation's function: transformers' registered one, or the model family's own eager one."""
    from transformers import AttentionInterface

    if base in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[base]
    return sys.modules[type(module).__module__].eager_attention_forward


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> torch.Tensor:
    """Causal attention of packed sequences: ``query`` ``[1, H, T, D]``, ``key``/``value`` ``[1, H_kv, T, D]``,
    the sequences' boundaries in ``kwargs["cu_seq_lens_q"]`` (the same for keys). Returns ``[1, T, H, D]``, the
    layout transformers' attention functions return."""
    for unsupported in ("s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise PackedAttentionUnsupported(
                f"{type(module).__name__} passes {unsupported!r} to its attention, which packed sequences do not "
                "reproduce"
            )
    if query.size(0) != 1:
        raise ValueError(f"packed attention takes one row of packed sequences, got a batch of {query.size(0)}")
    bounds = kwargs["cu_seq_lens_q"]
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    groups = query.size(1) // key.size(1)
    window = sliding_window if sliding_window is not None and sliding_window > 0 else None
    if query.is_cuda and softcap is None and dropout == 0.0:
        fused = _flash_varlen(query, key, value, bounds, int(kwargs["max_length_q"]), scale, window, groups)
        if fused is not None:
            return fused
    edges = bounds.tolist()
    outputs = []
    for start, end in zip(edges[:-1], edges[1:]):
        q, k, v = query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]
        outputs.append(_one_sequence(q, k, v, scale, groups, window, softcap, dropout if module.training else 0.0))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def _one_sequence(q, k, v, scale, groups, window, softcap, dropout) -> torch.Tensor:
    """Causal attention of one sequence ``[1, H, L, D]`` (keys and values ``[1, H_kv, L, D]``)."""
    length = q.size(2)
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    allowed = None
    if window is not None and length > window:
        position = torch.arange(length, device=q.device)
        distance = position.unsqueeze(1) - position.unsqueeze(0)
        allowed = (distance >= 0) & (distance < window)
    if softcap is None:
        return nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=dropout, is_causal=allowed is None, scale=scale
        )
    # Gemma 2's soft-capped scores: eager arithmetic, as transformers' eager attention does it
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, -math.inf)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=dropout > 0)
    return torch.matmul(weights, v)


def _flash_varlen(query, key, value, bounds, max_length, scale, window, groups) -> torch.Tensor | None:
    """All sequences in one call of PyTorch's variable-length flash kernel (CUDA, half precision), or ``None`` where
    this PyTorch has none or it does not take these inputs (the per-sequence path runs instead)."""
    if query.dtype not in (torch.float16, torch.bfloat16) or _FLASH_VARLEN_FAILED:
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    options: dict = {"scale": scale}
    if "window_size" in parameters:
        options["window_size"] = (-1 if window is None else window - 1, 0)
    elif window is None and "is_causal" in parameters:
        options["is_causal"] = True
    else:
        return None
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, H, D]
    if groups > 1:
        if "enable_gqa" in parameters:
            options["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    bounds = bounds.to(device=query.device, dtype=torch.int32)
    try:
        out = varlen_attn(q, k, v, bounds, bounds, max_length, max_length, **options)
    except (RuntimeError, TypeError, ValueError) as error:  # a kernel this GPU or PyTorch build lacks
        if not _FLASH_VARLEN_FAILED:
            _FLASH_VARLEN_FAILED.append(error)
            warnings.warn(
                f"PyTorch's varlen_attn failed ({error}); packed sequences take scaled_dot_product_attention one "
                "sequence at a time (same values, more kernel launches).",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    return out.unsqueeze(0)  # [1, T, H, D]
