"""The non-finite-step guard: an optimizer step whose loss was NaN or infinite is skipped, not taken.

No TRL import. The trainer records, once per micro-batch, whether any process saw a non-finite loss (a
collective, so every process skips the same steps) and installs the guard on its optimizer; the guard skips the next
``optimizer.step`` after a flagged micro-batch, warns, and after more than ``patience`` skipped steps in a row
raises :class:`NonFiniteLossError` (the parameters are then those of the last finite step).

It also holds the launch check: ``accelerate launch --cpu --num_processes 2`` silently runs one process, which
:func:`warn_if_launcher_lost_processes` reports.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

from ..utils.user_warnings import user_stacklevel


class NonFiniteLossError(RuntimeError):
    """More consecutive optimizer steps than ``nonfinite_loss_patience`` had a NaN or infinite loss."""


class NonFiniteLossWarning(UserWarning):
    """An optimizer step was skipped because its loss was NaN or infinite."""


class NonFiniteStepGuard:
    """Skips optimizer steps that follow a non-finite loss; counts them (``skipped``, ``consecutive``)."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.pending = False
        self.consecutive = 0
        self.skipped = 0

    def record(self, nonfinite: bool) -> None:
        """Mark the current optimizer step as non-finite (called for every micro-batch of it)."""
        self.pending = self.pending or nonfinite

    def install(
        self,
        optimizer: Any,
        step_number: Callable[[], int],
        on_skip: Callable[[int], None] | None = None,
    ) -> Any:
        """Wrap ``optimizer.step`` (once): a flagged step is skipped; ``step_number()`` names it in messages and
        ``on_skip(skipped_so_far)`` is called for each skip (the trainer logs it)."""
        if getattr(optimizer, "_trl_reasoning_guarded", False):
            return optimizer
        step = optimizer.step

        @functools.wraps(step)
        def guarded_step(*args, **kwargs):
            if self.pending:
                self.pending = False
                self._skip(step_number(), on_skip)
                return None
            self.consecutive = 0
            return step(*args, **kwargs)

        optimizer.step = guarded_step
        optimizer._trl_reasoning_guarded = True
        return optimizer

    def _skip(self, step: int, on_skip: Callable[[int], None] | None) -> None:
        self.skipped += 1
        self.consecutive += 1
        if on_skip is not None:
            on_skip(self.skipped)
        if self.consecutive > self.patience:
            raise NonFiniteLossError(
                f"{self.consecutive} consecutive optimizer steps had a NaN or infinite loss (step {step}; "
                f"nonfinite_loss_patience={self.patience}). The parameters are those of the last finite step. Check "
                "the rewards, the learning rate and mixed precision, or raise nonfinite_loss_patience."
            )
        warnings.warn(
            f"Skipped optimizer step {step}: its loss was NaN or infinite (parameters and optimizer state untouched; "
            f"{self.consecutive} in a row, patience {self.patience}).",
            NonFiniteLossWarning,
            stacklevel=user_stacklevel(),
        )


class LaunchWarning(UserWarning):
    """The run is not launched as asked: fewer processes than the launcher requested, or FSDP requested but not on."""


def requested_processes(launcher_argv: list[str]) -> int | None:
    """The process count an ``accelerate launch`` command line asks for (``--num_processes N`` or
    ``--num_processes=N``), or ``None`` when ``launcher_argv`` is not one or does not say."""
    launcher = launcher_argv[:3]  # [python] accelerate launch ...
    is_accelerate = any(os.path.basename(arg) == "accelerate" or arg.endswith("accelerate_cli.py") for arg in launcher)
    if not is_accelerate or "launch" not in launcher_argv[:4]:
        return None
    for index, arg in enumerate(launcher_argv):
        for flag in ("--num_processes", "--num-processes"):
            if arg == flag and index + 1 < len(launcher_argv):
                value = launcher_argv[index + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            return int(value) if value.isdigit() else None
    return None


def warn_if_launcher_lost_processes(world_size: int) -> None:
    """Warn when ``accelerate launch --num_processes N`` (N > 1) started this run but it has fewer processes: with
    ``--cpu`` accelerate runs a single process and says nothing, so a "two-process" test or run is a one-process one.
    Reads the parent process's command line (psutil, a TRL dependency); silent when it cannot."""
    try:
        import psutil

        launcher = psutil.Process(os.getppid()).cmdline()
    except Exception:  # noqa: BLE001 - best effort: no psutil, no permission, no parent
        return
    requested = requested_processes(launcher)
    if requested is not None and requested > world_size:
        warnings.warn(
            f"`accelerate launch` asked for {requested} processes, but this run has {world_size}: with `--cpu`, "
            "accelerate starts one process and ignores --num_processes. On CPUs, launch several with "
            f"`torchrun --nproc_per_node {requested} ...` or `accelerate launch --multi_gpu --num_processes "
            f"{requested} ...` with `use_cpu=True` in the training config (recipes/README.md).",
            LaunchWarning,
            stacklevel=user_stacklevel(),
        )


def warn_if_fsdp_not_applied(fsdp_requested: bool, distributed_type: str) -> None:
    """Warn when FSDP was asked for (``fsdp`` in the training config, or an accelerate FSDP config) but the run is not
    sharded: accelerate turns an FSDP config into FSDP only on GPU-type backends, so on CPUs (``MULTI_CPU``) it trains
    with plain data parallelism and full replicas, without a word."""
    if fsdp_requested and "FSDP" not in str(distributed_type):
        warnings.warn(
            f"FSDP was requested but this run is {distributed_type}, not FSDP: accelerate enables FSDP only on GPU-type "
            "backends, so on CPUs every process holds the whole model (data parallel). On a CPU machine, use "
            "DeepSpeed ZeRO (recipes/accelerate/zero3.yaml with use_cpu=True) to shard, or run on GPUs.",
            LaunchWarning,
            stacklevel=user_stacklevel(),
        )
