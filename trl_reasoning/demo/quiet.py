"""The main job prints its own lines only: other libraries' notices that its user can do nothing about are dropped.

``python -m trl_reasoning.demo`` printed, before and between its own lines, what its imports and TRL say to
*their* developers, each filtered here at its source, by its exact message:

- bitsandbytes (imported by peft, which transformers and TRL import): "Failed to load CPU gemm_4bit_forward from
  kernels-community ..." — a ``logging`` warning of the logger ``bitsandbytes.backends.cpu.ops`` (printed by
  Python's last-resort handler: bitsandbytes sets none), about an optional kernel for 4-bit models, which the demo
  does not use;
- DeepSpeed (imported by accelerate when it unwraps a model): "Setting accelerator to CPU. ..." — a ``logging``
  warning of the logger ``DeepSpeed``, which writes to stdout with a handler of its own; the demo runs on the CPU
  on purpose;
- transformers, when TRL unwraps the model for generation: "`is_gradient_checkpointing` is deprecated ..." — a
  ``FutureWarning`` issued in ``transformers.modeling_utils``, for TRL's developers;
- transformers' GGUF loader, on the first run only (the model's conversion): a "Converting and de-quantizing GGUF
  tensors..." progress bar of ``tqdm`` (not transformers' own switchable bar); the job prints the conversion's time
  on its next line ("model: ... ready in N s"). ``TQDM_DISABLE=1`` is set unless the user set it, before tqdm is
  imported (tqdm reads it then).

The main job installs these before its first import of those libraries (``python -m trl_reasoning.demo``, its
``__main__``), and so does every ``trl-reasoning`` command (:func:`console_main`, the console script, whose
``--help`` opened with bitsandbytes' notice). The main job also prints a warning as its message alone
(``Category: message``), as its other lines: Python's default adds the source path and the user's line
(``trainer.train()``), which tell its user nothing. A user's own script that imports trl_reasoning sees every notice
and Python's warning format, as without this package.
"""

from __future__ import annotations

import logging
import os
import warnings

#: ``(logger name, start of the message)``: the log records the main job drops.
NOISE_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
    ("DeepSpeed", "Setting accelerator to CPU."),
)
#: ``(category, message regex, module regex)``: the warnings the main job ignores (``warnings.filterwarnings``).
NOISE_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils"),
)


class _DropRecordsStartingWith(logging.Filter):
    """Drops the records of one logger whose message starts with ``prefix``; passes every other."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def quiet_library_noise() -> None:
    """Drop :data:`NOISE_LOG_RECORDS` and ignore :data:`NOISE_WARNINGS` in this process (idempotent). A filter on the
    logger itself acts before any handler, whether the library has added its own yet or not: so this can run before
    the libraries are imported, as it must to catch what they print at import."""
    for name, prefix in NOISE_LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecordsStartingWith) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropRecordsStartingWith(prefix))
    for category, message, module in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    os.environ.setdefault("TQDM_DISABLE", "1")


def message_only(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` of the main job: ``Category: message``, without the source path and line."""
    return f"{category.__name__}: {message}\n"


def console_main() -> None:
    """The ``trl-reasoning`` console script: drops :data:`NOISE_LOG_RECORDS` and :data:`NOISE_WARNINGS` before
    ``trl_reasoning.cli``'s imports print them, then runs the command; ``trl-reasoning demo`` (the main job, as
    ``python -m trl_reasoning.demo``) also prints each warning as its message alone (:func:`message_only`)."""
    import sys

    from ..cli.usage import asks_for_usage, usage

    if asks_for_usage(sys.argv[1:]):  # answered without importing the presets, TRL or torch
        print(usage())
        return
    quiet_library_noise()
    if sys.argv[1:2] == ["demo"]:
        warnings.formatwarning = message_only
    from ..cli import main

    main()
