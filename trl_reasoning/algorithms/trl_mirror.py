"""What the loss re-implements from TRL's ``GRPOTrainer._compute_loss`` (TRL 1.16.0), as pure functions.

The trainer computes its own loss (any objective, any aggregation), so the pieces of TRL's loss that act on every
objective are mirrored here, each citing what it mirrors. The TRL-equivalence tests (``tests/trainer/test_trl_equivalence.py``)
compare whole losses and gradients with TRL's on the same batch, so a change in TRL shows up there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


def k3_kl(
    ref_logps: torch.Tensor,
    logps: torch.Tensor,
    old_logps: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    bias_correction: bool = False,
    sequence_level: bool = False,
) -> torch.Tensor:
    """TRL's per-token KL to the reference model, ``k3 = exp(r) - r - 1`` with ``r = log pi_ref - log pi``
    (``grpo_trainer.py``, "Compute the KL divergence between the model and the reference model").

    With ``bias_correction`` (TRL's ``use_bias_correction_kl``) it is multiplied by the importance weight
    ``pi / pi_old``, per token, or per sequence (length-normalised, masked) when ``sequence_level`` (TRL's
    ``importance_sampling_level="sequence"``)."""
    log_ref_ratio = ref_logps - logps
    kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1
    if bias_correction:
        log_ratio = logps - old_logps
        if sequence_level:
            log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        kl = kl * torch.exp(log_ratio)
    return kl


def masked_means_over_processes(
    values: Mapping[str, torch.Tensor],
    mask: torch.Tensor,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    per_process: Mapping[str, torch.Tensor] | None = None,
    active_rows: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means of a micro-batch's loss metrics over all processes, in one collective.

    ``values``: ``(B, T)`` per-token values, averaged over the tokens where ``mask`` is 1, or ``(B, 1)`` per-sequence
    values, averaged over the sequences (TRL's metrics, e.g. ``entropy``, ``clip_ratio/*``); ``per_process``: one
    scalar per process, averaged over processes (``policy_loss``). ``active_rows`` (``(B,)``, 1 or 0): the sequences
    a per-sequence value is averaged over, where group selection dropped some (their rows train nothing; TRL, which
    drops none, averages over every row, as ``None`` does). ``reduce_sum`` sums a tensor over processes
    (``accelerator.reduce(..., reduction="sum")``); it is called once, so every process must pass the same keys. A
    metric that no process has a token (or sequence) for is left out of the result."""
    per_process = per_process or {}
    rows, names = [], []
    for name, value in values.items():
        value = value.float()
        if value.shape[-1] == 1 and mask.shape[-1] != 1:  # one value per sequence
            if active_rows is None:
                rows.append(torch.stack([value.sum(), torch.tensor(float(value.shape[0]), device=value.device)]))
            else:
                weight = active_rows.to(value.dtype).reshape(value.shape)
                rows.append(torch.stack([(value * weight).sum(), weight.sum()]))
        else:
            rows.append(torch.stack([(value * mask).sum(), mask.sum().float()]))
        names.append(name)
    for name, value in per_process.items():
        rows.append(torch.stack([value.float().reshape(()), torch.ones((), device=value.device)]))
        names.append(name)
    if not rows:
        return {}
    totals = reduce_sum(torch.stack(rows)).tolist()
    # a mean over no token or sequence on any process (a micro-batch of filler groups only) is left out, as the loss
    # leaves those rows out: a 0.0 would read as a measured value
    return {name: total / count for name, (total, count) in zip(names, totals, strict=True) if count > 0}
