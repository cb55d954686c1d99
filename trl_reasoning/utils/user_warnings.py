"""Warnings that point at the user's line.

A warning raised while ``trainer.train()`` runs is issued many frames deep in this package, transformers and TRL;
with a fixed ``stacklevel`` Python would report one of those frames. ``user_stacklevel`` counts the frames up to the
first one outside these libraries (the user's script or notebook cell), so the warning names the user's line.

Two kinds of frame need saying. The standard library's frozen modules (``<frozen runpy>`` of ``python -m``,
``<frozen importlib._bootstrap>``) are library frames: counted as the user's, a warning raised under ``python -m``
pointed at ``<frozen runpy>:88``. The package's own entry points (the demo, ``python -m trl_reasoning.demo``; the
command line, ``trl-reasoning``) are the user's frames: there the user's script is ours, and their line that
called ``train()`` is the one to name.

This module imports none of the libraries it names (it finds their folders), so that modules kept free of TRL
imports can use it.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _package_dir(name: str) -> str | None:
    """The folder of the installed package ``name`` (with a trailing separator), without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin) + os.sep


_OWN_DIR = os.path.dirname(sys.modules[__package__.partition(".")[0]].__file__) + os.sep
_LIBRARY_DIRS = tuple(
    folder
    for folder in (
        _OWN_DIR,
        *(_package_dir(name) for name in ("trl", "transformers", "accelerate", "torch")),
        os.path.dirname(os.__file__) + os.sep,  # the standard library
    )
    if folder is not None
)
#: The package's entry points, whose frames are the user's (see the module's docstring).
_ENTRY_POINTS = (os.path.join(_OWN_DIR, "demo") + os.sep, os.path.join(_OWN_DIR, "cli") + os.sep)


def _is_library_frame(filename: str) -> bool:
    """Whether a frame of ``filename`` is library code, to be passed over on the way to the user's frame."""
    if filename.startswith(_ENTRY_POINTS):
        return False
    # "<string>": code generated at run time (a dataclass's __init__, which runs a config's __post_init__);
    # "<frozen ...>": the standard library's frozen modules (runpy, importlib)
    return filename.startswith(_LIBRARY_DIRS) or filename == "<string>" or filename.startswith("<frozen ")


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the caller of this function, report the first
    frame outside trl-reasoning, TRL, transformers, accelerate, torch and the standard library, or in the package's
    entry points (1 if there is none)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and _is_library_frame(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 1
