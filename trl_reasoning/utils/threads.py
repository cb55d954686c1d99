"""How many torch threads a run uses: the cores other processes leave free, measured when the run starts.

torch's default is one intra-op thread per core. That is right on a quiet machine (a SmolLM2-135M LoRA step on 2 cores:
13.5 s with 2 threads, 16.6 s with 1) and wrong on a busy one, where OpenMP threads spin against the other processes
(the tiny warm start: 12 s with one thread, 567 s with two on a 2-core machine running two other jobs). So the default
(``num_threads=None``, "auto") is torch's default less the cores that other processes keep busy *now*: the machine's
CPU time over a short window (``/proc/stat`` through psutil) minus this process's own. Not the load average, which
lags by a minute: right after ``pip install`` it reads 1-2 on a machine that is idle by then.

Several processes of one run (``torchrun``/``accelerate launch``) share the free cores: each takes its share
(``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

#: Seconds over which the other processes' CPU use is measured.
MEASURE_SECONDS = 0.5
#: A core counts as busy when other processes used at least this share of it over the window.
BUSY_SHARE = 0.5


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cores(seconds: float = MEASURE_SECONDS) -> float:
    """Cores kept busy by *other* processes over the next ``seconds``: the machine's CPU time in that window minus
    this process's own, in cores (``0.0`` where it cannot be measured)."""
    try:
        import psutil
    except ImportError:  # psutil comes with accelerate; without it, assume the machine is free
        return 0.0
    me = psutil.Process()
    own_before = sum(me.cpu_times()[:2])
    psutil.cpu_percent(interval=None)  # starts the machine-wide window
    wall_before = time.monotonic()
    time.sleep(seconds)
    machine = psutil.cpu_percent(interval=None) / 100.0 * (psutil.cpu_count() or 1)
    own = (sum(me.cpu_times()[:2]) - own_before) / max(time.monotonic() - wall_before, 1e-6)
    return max(machine - own, 0.0)


def processes_sharing_cores() -> int:
    """Processes of this run on this machine (``LOCAL_WORLD_SIZE`` as torchrun and accelerate set it; 1 otherwise)."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def auto_threads(default_threads: int, busy: float, cores: int, processes: int = 1) -> int:
    """The "auto" thread count: ``default_threads`` (torch's default) capped by this process's share of the cores
    other processes leave free, at least 1. A core counts as busy from ``BUSY_SHARE`` of its time."""
    busy_whole = int(busy + (1.0 - BUSY_SHARE))  # 0.5 of a core -> 1 busy core, 0.4 -> 0
    free = max(cores - busy_whole, 1)
    return max(min(default_threads, free // processes), 1)


def resolve_threads(requested: int | None, default_threads: int | None = None) -> int:
    """The torch thread count for ``requested``: ``None`` is "auto" (:func:`auto_threads`, measured now), ``0`` is
    torch's default, a positive number is taken as is.

    Raises:
        ValueError: ``requested`` is negative.
    """
    import torch

    if requested is not None and requested < 0:
        raise ValueError(f"num_threads must be None (auto), 0 (torch's default) or positive, got {requested}.")
    default_threads = torch.get_num_threads() if default_threads is None else default_threads
    if requested == 0:
        return default_threads
    if requested is not None:
        return requested
    return auto_threads(default_threads, busy_cores(), usable_cores(), processes_sharing_cores())


@contextlib.contextmanager
def torch_threads(requested: int | None) -> Iterator[int]:
    """Within the block torch uses :func:`resolve_threads` ``(requested)`` intra-op threads (yielded); afterwards
    what it used before."""
    import torch

    before = torch.get_num_threads()
    threads = resolve_threads(requested, before)
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
