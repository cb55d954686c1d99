"""Warnings that point at the user's line.

A warning raised while ``trainer.train()`` runs is issued many frames deep in this package, transformers and TRL;
with a fixed ``stacklevel`` Python would report one of those frames. ``user_stacklevel`` counts the frames up to the
first one outside these libraries (the user's script or notebook cell), so the warning names the user's line.
"""

from __future__ import annotations

import os
import sys

import accelerate
import torch
import transformers
import trl

_LIBRARY_DIRS = tuple(
    os.path.dirname(module.__file__) + os.sep
    for module in (
        sys.modules[__package__.partition(".")[0]],
        trl,
        transformers,
        accelerate,
        torch,
        os,
    )  # os: the standard library
)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the caller of this function, report the first
    frame outside trl-reasoning, TRL, transformers, accelerate, torch and the standard library (1 if there is none)."""
    frame = sys._getframe(1)
    level = 1
    # "<string>": code generated at run time (a dataclass's __init__, which runs a config's __post_init__)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_LIBRARY_DIRS) or frame.f_code.co_filename == "<string>"
    ):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1
