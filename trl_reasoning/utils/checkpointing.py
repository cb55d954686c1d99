"""Activation checkpointing under the names of the installed transformers.

transformers renamed gradient checkpointing to activation checkpointing (``TrainingArguments.activation_checkpointing``,
``model.is_activation_checkpointing``, ``activation_checkpointing_enable``/``_disable``); the old names still work but
emit a ``FutureWarning`` at every use. The package calls the new names where the installed transformers has them and
the old ones where it does not, so its own calls warn about nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from transformers import TrainingArguments

#: The config field that turns activation checkpointing on or off in the installed transformers.
CHECKPOINTING_FIELD = (
    "activation_checkpointing"
    if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)


def is_activation_checkpointing(model: Any) -> bool:
    """Whether ``model`` (a transformers model) recomputes activations in its backward pass."""
    enabled = getattr(model, "is_activation_checkpointing", None)  # a PEFT model forwards it to its base model
    return model.is_gradient_checkpointing if enabled is None else enabled


@contextlib.contextmanager
def activation_checkpointing_disabled(model: Any, checkpointing_kwargs: dict | None = None) -> Iterator[None]:
    """Turn activation checkpointing off on ``model`` inside the block and back on (with ``checkpointing_kwargs``)
    after it, as TRL's ``disable_gradient_checkpointing`` does, under the installed transformers' names."""
    was_enabled = is_activation_checkpointing(model)
    new_names = hasattr(model, "activation_checkpointing_disable")
    if was_enabled:
        model.activation_checkpointing_disable() if new_names else model.gradient_checkpointing_disable()
    try:
        yield
    finally:
        if was_enabled and new_names:
            model.activation_checkpointing_enable(checkpointing_kwargs)
        elif was_enabled:
            model.gradient_checkpointing_enable(checkpointing_kwargs)
