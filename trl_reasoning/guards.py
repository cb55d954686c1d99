"""The non-finite-step guard: an optimizer step whose loss was NaN or infinite is skipped, not taken.

Floor 0 (no TRL import). The trainer records, once per micro-batch, whether any process saw a non-finite loss (a
collective, so every process skips the same steps) and installs the guard on its optimizer; the guard skips the next
``optimizer.step`` after a flagged micro-batch, warns, and after more than ``patience`` skipped steps in a row
raises :class:`NonFiniteLossError` (the parameters are then those of the last finite step).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from ._warnings import user_stacklevel


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
