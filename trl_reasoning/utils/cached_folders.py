"""Folders built once and kept in the package's cache (the warm-started models of the demo and the tool task).

The cache is ``$TRL_REASONING_CACHE`` or ``~/.cache/trl-reasoning``. A folder is built in a staging folder beside its
place and moved there in one rename, so a half-written folder is never reused; with ``exclusive``, processes that ask
at once (the ranks of one run) build it once, the others waiting under a file lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV_VAR = "TRL_REASONING_CACHE"


def default_cache_dir() -> Path:
    """``$TRL_REASONING_CACHE`` if set, else ``~/.cache/trl-reasoning``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "trl-reasoning")


def built_once(
    target: Path,
    build: Callable[[Path], Path],
    is_complete: Callable[[Path], bool],
    use_cache: bool = True,
    exclusive: bool = False,
) -> tuple[Path, bool]:
    """``(target, cached)``: ``target`` as it is when ``is_complete(target)`` (and ``use_cache``), else built by
    ``build(staging)`` (which returns the finished folder inside ``staging``) and moved to ``target`` atomically."""
    if use_cache and is_complete(target):
        return target, True
    target.parent.mkdir(parents=True, exist_ok=True)
    if not exclusive:
        return _build(target, build), False
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if use_cache and is_complete(target):  # another process built it while this one waited
            return target, True
        return _build(target, build), False


def _build(target: Path, build: Callable[[Path], Path]) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        folder = build(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
