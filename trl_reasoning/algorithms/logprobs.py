"""Memory-bounded log-probabilities over the vocabulary: the rollout top-K and the current policy's log-probs at ids.

Pure torch, no TRL import. Used by DPPO's top-K divergence (``docs/algorithms.md``, "DPPO's divergence
mask"; DPPO, arXiv 2602.04879): at generation time the rollout distribution's top-K tokens and their log-probs are
stored; in the loss the current policy is evaluated at the same ids. Neither step may hold more than one
``[batch, T, vocab]`` tensor, so every function here walks the positions in chunks of ``chunk_size`` rows and only ever
materialises ``[chunk, vocab]`` temporaries.

Temperature follows TRL: logits are divided by ``temperature`` before the softmax
(``trl.trainer.utils.selective_log_softmax``; TRL's fused LM head applies ``logit_scale``, then the final-logit
softcapping ``cap * tanh(z / cap)``, then ``1 / temperature``). Arithmetic is done in float32 at least (float64 stays
float64), so the returned log-probs have dtype ``float32`` for half-precision logits.

Ids must be valid vocabulary ids at every position, padding included (TRL pads completions with ``pad_token_id``);
padding positions give finite values that the caller masks out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from .truncation import SamplingTruncation, support_mask

#: The most positions (rows of ``vocab`` logits) processed at once when ``chunk_size`` is not given.
DEFAULT_CHUNK_SIZE = 128
#: TRL's fused LM head projects tiles of at most ``TRL_TILE_POSITIONS`` positions by 32,768 vocabulary columns (float32
#: scratch, ``trl.kernels.chunked_logprob``). A chunk here keeps about three ``[chunk, vocab]`` float32 temporaries alive,
#: so its positions are sized to hold a quarter of such a tile's elements each (``chunk_size_for``): the largest tensor
#: of a step that scores through these functions stays below the one TRL's head allocates for the same positions.
TRL_TILE_POSITIONS = 4096
ELEMENTS_PER_POSITION_OF_TILE = 32768 // 4


def chunk_size_for(positions: int, vocab: int, most: int = DEFAULT_CHUNK_SIZE) -> int:
    """Positions per chunk for ``positions`` positions over a ``vocab``-wide vocabulary: at most ``most``, and small
    enough that one ``[chunk, vocab]`` temporary holds a quarter of the elements of TRL's fused-head tile for the same
    positions (``min(positions, 4096) x 32768``). With Qwen's 151,936 tokens and 2,056 positions: 110."""
    budget = min(max(positions, 1), TRL_TILE_POSITIONS) * ELEMENTS_PER_POSITION_OF_TILE
    return max(1, min(most, budget // max(vocab, 1)))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(batch: int, length: int, chunk_size: int) -> Iterator[tuple[slice, slice]]:
    """``(batch_slice, position_slice)`` pairs covering ``[batch, length]`` with at most ``chunk_size`` positions each.

    Whole sequences are grouped when ``chunk_size >= length``; otherwise one sequence is cut into position ranges. Both
    cases index a ``[B, T, V]`` tensor with basic slices only, so the chunk is a view (no copy of the input).
    """
    if length == 0 or batch == 0:
        return
    if chunk_size >= length:
        rows = chunk_size // length
        for b0 in range(0, batch, rows):
            yield slice(b0, min(b0 + rows, batch)), slice(0, length)
    else:
        for b in range(batch):
            for t0 in range(0, length, chunk_size):
                yield slice(b, b + 1), slice(t0, min(t0 + chunk_size, length))


def _check_args(temperature: float, chunk_size: int | None, shape: torch.Size, vocab: int) -> int:
    """Check the arguments; the positions per chunk (``chunk_size``, or :func:`chunk_size_for` the ``[..., T]``
    positions of ``shape``)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is None:
        return chunk_size_for(math.prod(shape[:2]), vocab)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return chunk_size


# ---------------------------------------------------------------------------------------------------------------------
# Generation time: the rollout distribution's top-K (no gradient)
# ---------------------------------------------------------------------------------------------------------------------


def _topk_of_chunk(z: torch.Tensor, sampled: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` ids/log-probs of the tempered logits ``z`` ``[..., V]``, the sampled id swapped in for the last one."""
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    values, ids = torch.topk(z, k, dim=-1)
    logps = values - lse
    present = (ids == sampled.unsqueeze(-1)).any(dim=-1)
    sampled_logp = z.gather(-1, sampled.unsqueeze(-1)).squeeze(-1) - lse.squeeze(-1)
    ids[..., -1] = torch.where(present, ids[..., -1], sampled)
    logps[..., -1] = torch.where(present, logps[..., -1], sampled_logp)
    return ids, logps


def _resolve_k(k: int, vocab: int) -> int:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return min(k, vocab)


@torch.no_grad()
def rollout_topk(
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    k: int = 20,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout distribution's top-K token ids and log-probs, the sampled token always among them.

    ``mu = softmax(logits / temperature)`` per position. The ``K = min(k, vocab)`` most likely ids are returned in
    decreasing probability; where the sampled id is not among them it replaces the ``K``-th (least likely) entry, so
    ``sampled_ids`` is always in ``ids`` (DPPO's top-K approximation, arXiv 2602.04879).

    Args:
        logits: ``[B, T, V]`` raw logits of the rollout policy at the completion positions (any float dtype; read in
            chunks, never copied whole).
        sampled_ids: ``[B, T]`` integer ids of the sampled completion tokens (valid ids also at padding).
        k: number of tracked tokens (DPPO: 20); clamped to ``V``.
        temperature: the sampling temperature; logits are divided by it (TRL's convention).
        chunk_size: positions per chunk; peak scratch is ``O(chunk_size * V)``. ``None``: :func:`chunk_size_for`.

    Returns:
        ``(ids, logps)``: ``ids`` ``[B, T, K]`` int64, ``logps`` ``[B, T, K]`` float32 (float64 for float64 logits),
        without gradient.
    """
    chunk_size = _check_args(temperature, chunk_size, logits.shape, logits.shape[-1])
    batch, length, vocab = logits.shape
    k = _resolve_k(k, vocab)
    dtype = _compute_dtype(logits.dtype)
    ids = torch.empty(batch, length, k, dtype=torch.long, device=logits.device)
    logps = torch.empty(batch, length, k, dtype=dtype, device=logits.device)
    sampled_ids = sampled_ids.to(device=logits.device, dtype=torch.long)
    for bs, ts in _chunks(batch, length, chunk_size):
        z = logits[bs, ts].to(dtype) / temperature
        ids[bs, ts], logps[bs, ts] = _topk_of_chunk(z, sampled_ids[bs, ts], k)
    return ids, logps


def _rank_of_sampled(token: int, entry_ids: Sequence[int], row: int, position: int) -> int:
    try:
        return list(entry_ids).index(token)
    except ValueError:
        raise ValueError(
            f"sequence {row}, position {position}: the sampled token {token} is not among the engine's log-probs; they "
            "do not belong to these completions"
        ) from None


def engine_sampled_logprobs(
    completion_ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[Sequence[float | None]]],
    logprob_token_ids: Sequence[Sequence[Sequence[int]]],
) -> list[list[float | None]]:
    """The engine's log-prob of each sampled token, from the same ranked ``(logprobs, logprob_token_ids)`` as
    :func:`rollout_topk_from_engine`. (With ``logprobs=k > 0`` the first entry is the most likely token, not the
    sampled one, so the sampled token has to be looked up.)"""
    return [
        [
            entry_logps[_rank_of_sampled(token, entry_ids, row, position)]
            for position, (token, entry_logps, entry_ids) in enumerate(zip(seq, seq_logps, seq_ids, strict=True))
        ]
        for row, (seq, seq_logps, seq_ids) in enumerate(zip(completion_ids, logprobs, logprob_token_ids, strict=True))
    ]


def _extend_with_engine_topk(
    flat_ids: list[int],
    flat_logps: list[float | None],
    row: int,
    seq: Sequence[int],
    seq_logps: Sequence[Sequence[float | None]],
    seq_ids: Sequence[Sequence[int]],
    k: int,
) -> None:
    """Append sequence ``row``'s tracked ids and log-probs, ``k`` per position (the engine's first ``k`` entries, the
    sampled token replacing the ``k``-th where it is not among them), to the flat lists of
    :func:`rollout_topk_from_engine`."""
    if not len(seq) == len(seq_logps) == len(seq_ids):
        raise ValueError(
            f"sequence {row}: {len(seq)} completion tokens but log-probs for {len(seq_logps)} and ids for "
            f"{len(seq_ids)} positions"
        )
    for position, (token, entry_logps, entry_ids) in enumerate(zip(seq, seq_logps, seq_ids, strict=True)):
        if len(entry_ids) < k:
            raise ValueError(
                f"sequence {row}, position {position}: the engine reported {len(entry_ids)} log-probs, fewer "
                f"than k={k}; request logprobs={k} from the engine (and keep k <= the vocabulary size)"
            )
        top_ids, top_logps = list(entry_ids[:k]), list(entry_logps[:k])
        if token not in top_ids:
            top_ids[-1], top_logps[-1] = token, entry_logps[_rank_of_sampled(token, entry_ids, row, position)]
        flat_ids.extend(top_ids)
        flat_logps.extend(top_logps)


def rollout_topk_from_engine(
    completion_ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[Sequence[float | None]]],
    logprob_token_ids: Sequence[Sequence[Sequence[int]]],
    k: int,
    length: int | None = None,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rollout_topk` from an inference engine's own log-probs (vLLM's ``logprobs=k`` output), no forward pass.

    The engine that sampled reports, per completion position, its ``k`` most likely tokens plus the sampled one (vLLM
    always adds it, so a position has ``k`` or ``k + 1`` entries), ranked most likely first -- the shape TRL 1.16's
    ``VLLMGeneration.generate`` returns as ``(logprobs, logprob_token_ids)``. They must be *processed* log-probs
    (after temperature and logit processors), the distribution the token was drawn from: TRL's colocated engine runs
    with ``logprobs_mode="processed_logprobs"``; a vLLM server needs ``--logprobs-mode processed_logprobs``.

    As in :func:`rollout_topk`, the first ``k`` entries are kept in rank order and, where the sampled token is not
    among them, it replaces the ``k``-th entry with its own log-prob. Rows are right-padded to ``length``; padding
    positions hold ``pad_token_id`` ids and NaN log-probs, as do positions whose engine log-prob is ``None`` (vLLM's
    NaN), so :func:`trl_reasoning.algorithms.losses.topk_divergence` skips them.

    Args:
        completion_ids: the sampled ids, one list per sequence.
        logprobs: ``[seq][position][entry]`` log-probs, ranked (``None`` for NaN).
        logprob_token_ids: the ids of those entries, same nesting.
        k: number of tracked tokens; every position must report at least ``k`` entries.
        length: padded length ``T`` (default: the longest sequence).
        pad_token_id: id written at padding positions.

    Returns:
        ``(ids, logps)``: ``[B, T, k]`` int64 and float32 tensors on the CPU.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not len(completion_ids) == len(logprobs) == len(logprob_token_ids):
        raise ValueError(
            f"completion_ids, logprobs and logprob_token_ids hold {len(completion_ids)}, {len(logprobs)} and "
            f"{len(logprob_token_ids)} sequences; they must match"
        )
    longest = max((len(seq) for seq in completion_ids), default=0)
    length = longest if length is None else length
    if length < longest:
        raise ValueError(f"length={length} is shorter than the longest completion ({longest} tokens)")
    # Built as flat Python lists and converted once: one small tensor per position costs more than the rest.
    pad_ids, pad_logps = [pad_token_id] * k, [math.nan] * k
    flat_ids: list[int] = []
    flat_logps: list[float | None] = []
    for row, (seq, seq_logps, seq_ids) in enumerate(zip(completion_ids, logprobs, logprob_token_ids, strict=True)):
        _extend_with_engine_topk(flat_ids, flat_logps, row, seq, seq_logps, seq_ids, k)
        for _ in range(length - len(seq)):
            flat_ids.extend(pad_ids)
            flat_logps.extend(pad_logps)
    shape = (len(completion_ids), length, k)
    ids = torch.tensor(flat_ids, dtype=torch.long).view(shape)
    # None (vLLM's NaN) becomes NaN through numpy's float conversion.
    logps = torch.from_numpy(np.array(flat_logps, dtype=np.float32)).view(shape)
    return ids, logps


def _lm_head_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    logit_scale: float,
    softcap: float | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tempered logits ``z = softcap(logit_scale * (h W^T + b)) / T`` of one chunk, and ``tanh`` (for backward)."""
    # Runs without autograd (inside a custom Function or under no_grad), so the fresh chunk is updated in place.
    y = torch.nn.functional.linear(hidden, weight, bias).to(dtype)
    if logit_scale != 1.0:
        y.mul_(logit_scale)
    tanh = None
    if softcap is not None:
        tanh = y.div_(softcap).tanh_()
        y = tanh * (softcap / temperature)
    else:
        y.div_(temperature)
    return y, tanh


@torch.no_grad()
def rollout_topk_from_hidden(
    hidden_states: torch.Tensor,
    lm_head_weight: torch.Tensor,
    sampled_ids: torch.Tensor,
    k: int = 20,
    temperature: float = 1.0,
    lm_head_bias: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rollout_topk` from the last hidden states: the ``[B, T, V]`` logits are never formed.

    ``logits = softcap(logit_scale * (hidden @ W^T + b))``, as TRL's fused LM head (``add_fused_lm_head``) builds them;
    ``hidden_states`` ``[B, T, H]``, ``lm_head_weight`` ``[V, H]``. Same outputs as :func:`rollout_topk`.
    """
    chunk_size = _check_args(temperature, chunk_size, hidden_states.shape, lm_head_weight.shape[0])
    batch, length, _ = hidden_states.shape
    vocab = lm_head_weight.shape[0]
    k = _resolve_k(k, vocab)
    dtype = _compute_dtype(hidden_states.dtype)
    ids = torch.empty(batch, length, k, dtype=torch.long, device=hidden_states.device)
    logps = torch.empty(batch, length, k, dtype=dtype, device=hidden_states.device)
    sampled_ids = sampled_ids.to(device=hidden_states.device, dtype=torch.long)
    for bs, ts in _chunks(batch, length, chunk_size):
        z, _ = _lm_head_logits(
            hidden_states[bs, ts],
            lm_head_weight,
            lm_head_bias,
            dtype,
            logit_scale,
            final_logit_softcapping,
            temperature,
        )
        ids[bs, ts], logps[bs, ts] = _topk_of_chunk(z, sampled_ids[bs, ts], k)
    return ids, logps


# ---------------------------------------------------------------------------------------------------------------------
# Loss time: the current policy's log-probs at given ids (with gradient), and its entropy
# ---------------------------------------------------------------------------------------------------------------------


def _entropy(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``lse - sum_j p_j z_j`` of one chunk (TRL's ``entropy_from_logits``), one ``[chunk, V]`` temporary besides
    ``z``."""
    weighted = (z - lse.unsqueeze(-1)).exp_().mul_(z)
    return lse - weighted.sum(-1)


def _gathered_chunk(z: torch.Tensor, index: torch.Tensor, truncation: SamplingTruncation | None):
    """``log softmax`` at ``index`` ``[..., M]``, the entropy and ``lse`` of one chunk of tempered logits ``z``, on the
    sampler's support when ``truncation`` is given. The entropy is always the whole distribution's (TRL's meaning of
    the logged ``entropy``: the truncated distribution's is several times smaller and would change the curve when a
    run switches to a truncated ratio), so the support's own is never computed."""
    entropy = _entropy(z, torch.logsumexp(z, dim=-1)) if truncation is not None else None
    z = _on_support(z, index, truncation)
    lse = torch.logsumexp(z, dim=-1)
    gathered = z.gather(-1, index) - lse.unsqueeze(-1)
    return gathered, _entropy(z, lse) if entropy is None else entropy, lse


def _on_support(z: torch.Tensor, index: torch.Tensor, truncation: SamplingTruncation | None) -> torch.Tensor:
    """``z`` restricted to the sampler's support (``-inf`` outside), the sampled token (``index[..., 0]``) kept in it
    (``trl_reasoning.algorithms.truncation``); ``z`` itself without truncation. In place: ``z`` is a fresh chunk."""
    if truncation is None or not truncation.truncates:
        return z
    return z.masked_fill_(~support_mask(z, truncation, always=index[..., :1]), -math.inf)


def _grad_wrt_z(z: torch.Tensor, lse: torch.Tensor, index: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """``dL/dz_j = sum_m g_m [j == idx_m] - p_j sum_m g_m`` for ``L = sum_m g_m (z_{idx_m} - lse)`` (one chunk)."""
    grad = (z - lse.unsqueeze(-1)).exp_().mul_(-grad_out.sum(-1, keepdim=True))
    return grad.scatter_add_(-1, index, grad_out)


class _GatherLogProbsFromLogits(torch.autograd.Function):
    """Chunked ``log_softmax(logits / T)`` gathered at ``index`` (``[B, T, M]``), plus the entropy (no gradient).

    Saves only the logits (already alive) and ``lse`` ``[B, T]``; backward allocates the one gradient ``[B, T, V]``
    and fills it chunk by chunk.
    """

    @staticmethod
    def forward(ctx, logits, index, temperature, chunk_size, truncation=None):  # noqa: D102
        batch, length, _ = logits.shape
        dtype = _compute_dtype(logits.dtype)
        m = index.shape[-1]
        out = torch.empty(batch, length, m, dtype=dtype, device=logits.device)
        entropy = torch.empty(batch, length, dtype=dtype, device=logits.device)
        lse = torch.empty(batch, length, dtype=dtype, device=logits.device)
        for bs, ts in _chunks(batch, length, chunk_size):
            z = logits[bs, ts].to(dtype) / temperature
            out[bs, ts], entropy[bs, ts], lse[bs, ts] = _gathered_chunk(z, index[bs, ts], truncation)
        ctx.save_for_backward(logits, index, lse)
        ctx.temperature, ctx.chunk_size, ctx.truncation = temperature, chunk_size, truncation
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy):  # noqa: D102
        logits, index, lse = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        if grad_out is None:
            return grad_logits, None, None, None, None
        batch, length, _ = logits.shape
        dtype = lse.dtype
        grad_out = grad_out.to(dtype)
        for bs, ts in _chunks(batch, length, ctx.chunk_size):
            z = _on_support(logits[bs, ts].to(dtype) / ctx.temperature, index[bs, ts], ctx.truncation)
            grad_z = _grad_wrt_z(z, lse[bs, ts], index[bs, ts], grad_out[bs, ts])
            del z
            grad_logits[bs, ts] = grad_z.div_(ctx.temperature)
        return grad_logits, None, None, None, None


class _GatherLogProbsFromHidden(torch.autograd.Function):
    """As :class:`_GatherLogProbsFromLogits` with the logits rebuilt per chunk from ``hidden @ W^T + b``.

    Saves ``hidden`` ``[B, T, H]``, the weights and ``lse``; backward recomputes each chunk's logits, so no
    ``[B, T, V]`` tensor ever exists (forward or backward).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, temperature, logit_scale, softcap, chunk_size, truncation=None):  # noqa: D102
        batch, length, _ = hidden.shape
        dtype = _compute_dtype(hidden.dtype)
        m = index.shape[-1]
        out = torch.empty(batch, length, m, dtype=dtype, device=hidden.device)
        entropy = torch.empty(batch, length, dtype=dtype, device=hidden.device)
        lse = torch.empty(batch, length, dtype=dtype, device=hidden.device)
        for bs, ts in _chunks(batch, length, chunk_size):
            z, _ = _lm_head_logits(hidden[bs, ts], weight, bias, dtype, logit_scale, softcap, temperature)
            out[bs, ts], entropy[bs, ts], lse[bs, ts] = _gathered_chunk(z, index[bs, ts], truncation)
        ctx.save_for_backward(hidden, weight, bias, index, lse)
        ctx.args = (temperature, logit_scale, softcap, chunk_size, truncation)
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy):  # noqa: D102
        hidden, weight, bias, index, lse = ctx.saved_tensors
        temperature, logit_scale, softcap, chunk_size, truncation = ctx.args
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=lse.dtype) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=lse.dtype) if (need_b and bias is not None) else None
        if grad_out is not None:
            batch, length, _ = hidden.shape
            dtype = lse.dtype
            grad_out = grad_out.to(dtype)
            for bs, ts in _chunks(batch, length, chunk_size):
                h = hidden[bs, ts]
                z, tanh = _lm_head_logits(h, weight, bias, dtype, logit_scale, softcap, temperature)
                z = _on_support(z, index[bs, ts], truncation)
                grad_y = _grad_wrt_z(z, lse[bs, ts], index[bs, ts], grad_out[bs, ts]).div_(temperature)
                del z
                if tanh is not None:  # d(cap * tanh(y / cap))/dy = 1 - tanh^2
                    grad_y.mul_(tanh.square_().neg_().add_(1.0))
                    del tanh
                if logit_scale != 1.0:
                    grad_y.mul_(logit_scale)  # now dL/d(h W^T + b), [b, t, V]
                if grad_h is not None:
                    grad_h[bs, ts] = (grad_y.to(weight.dtype) @ weight).to(hidden.dtype)
                flat_g = grad_y.reshape(-1, grad_y.shape[-1])
                if grad_w is not None:
                    grad_w += flat_g.T @ h.reshape(-1, h.shape[-1]).to(dtype)
                if grad_b is not None:
                    grad_b += flat_g.sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _index(sampled_ids: torch.Tensor, topk_ids: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    index = sampled_ids.to(device=device, dtype=torch.long).unsqueeze(-1)
    if topk_ids is not None:
        index = torch.cat([index, topk_ids.to(device=device, dtype=torch.long)], dim=-1)
    return index


def _effective(truncation: SamplingTruncation | None) -> SamplingTruncation | None:
    return truncation if truncation is not None and truncation.truncates else None


def _check_truncation(truncation: SamplingTruncation | None, topk_ids: torch.Tensor | None) -> None:
    if _effective(truncation) is not None and topk_ids is not None:
        raise ValueError("truncation and topk_ids together: a stored top-K id may lie outside the truncated support")


def _split(out: torch.Tensor, entropy: torch.Tensor, with_topk: bool):
    return out[..., 0], entropy, (out[..., 1:] if with_topk else None)


def chunked_logps(
    logits: torch.Tensor,
    sampled_ids: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    truncation: SamplingTruncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The current policy's log-probs at the sampled ids and at the stored top-K ids, and its entropy, in chunks.

    With ``z = logits / temperature`` and ``lse = logsumexp_j z_j`` per position:
    ``logps = z[sampled] - lse``, ``topk_logps[..., k] = z[topk_ids[..., k]] - lse``, ``entropy = lse - sum_j p_j z_j``
    (TRL's ``selective_log_softmax`` and ``entropy_from_logits``). Gradients flow into ``logits`` through ``logps`` and
    ``topk_logps`` (a custom backward: ``dL/dz_j = sum_m g_m [j = id_m] - p_j sum_m g_m``, divided by ``temperature``);
    the entropy carries none.

    Memory: forward keeps only ``[chunk_size, V]`` scratch; backward allocates the single gradient ``[B, T, V]``.
    To avoid even that, use :func:`chunked_logps_from_hidden`.

    Args:
        logits: ``[B, T, V]`` raw logits of the current policy at the completion positions (with grad).
        sampled_ids: ``[B, T]`` sampled token ids.
        topk_ids: ``[B, T, K]`` ids stored by :func:`rollout_topk`, or ``None`` to skip them.
        temperature: the sampling temperature (logits are divided by it, as TRL does).
        chunk_size: positions per chunk.
        truncation: the sampler's top-k / top-p / min-p: the log-probs are then those of the truncated,
            renormalised distribution (``trl_reasoning.algorithms.truncation``: each position's own support, the
            sampled token kept in it), the gradient zero outside the support; the entropy stays the whole
            distribution's (TRL's logged ``entropy``). Not with ``topk_ids``.

    Returns:
        ``(logps [B, T], entropy [B, T], topk_logps [B, T, K] or None)``, float32 (float64 for float64 logits).
    """
    chunk_size = _check_args(temperature, chunk_size, logits.shape, logits.shape[-1])
    _check_truncation(truncation, topk_ids)
    index = _index(sampled_ids, topk_ids, logits.device)
    out, entropy = _GatherLogProbsFromLogits.apply(
        logits, index, float(temperature), int(chunk_size), _effective(truncation)
    )
    return _split(out, entropy, topk_ids is not None)


def chunked_logps_from_hidden(
    hidden_states: torch.Tensor,
    lm_head_weight: torch.Tensor,
    sampled_ids: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    lm_head_bias: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    chunk_size: int | None = None,
    truncation: SamplingTruncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`chunked_logps` from the last hidden states and the LM head: no ``[B, T, V]`` tensor at all.

    ``logits = softcap(logit_scale * (hidden @ W^T + b))`` (TRL's fused LM head order), then ``/ temperature``.
    Each chunk's logits are recomputed in backward, so memory is ``O(chunk_size * V)`` plus the gradients of
    ``hidden_states`` ``[B, T, H]`` and of the weight ``[V, H]``. Gradients flow into ``hidden_states``,
    ``lm_head_weight`` and ``lm_head_bias`` (where they require grad). Same outputs as :func:`chunked_logps`.
    """
    chunk_size = _check_args(temperature, chunk_size, hidden_states.shape, lm_head_weight.shape[0])
    _check_truncation(truncation, topk_ids)
    index = _index(sampled_ids, topk_ids, hidden_states.device)
    out, entropy = _GatherLogProbsFromHidden.apply(
        hidden_states,
        lm_head_weight,
        lm_head_bias,
        index,
        float(temperature),
        float(logit_scale),
        None if final_logit_softcapping is None else float(final_logit_softcapping),
        int(chunk_size),
        _effective(truncation),
    )
    return _split(out, entropy, topk_ids is not None)
