"""The thread count a run uses (``trl_reasoning.utils.threads``): torch's default less the cores other processes keep busy."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from trl_reasoning.utils.threads import auto_threads, busy_cores, resolve_threads, torch_threads


@pytest.mark.parametrize(
    ("default", "busy", "cores", "processes", "expected"),
    [
        (2, 0.0, 2, 1, 2),  # a quiet 2-core machine: both cores
        (2, 0.4, 2, 1, 2),  # a little background noise is not a busy core
        (2, 0.6, 2, 1, 1),  # one core mostly busy: one thread
        (2, 2.0, 2, 1, 1),  # all busy: still one thread
        (8, 3.0, 8, 1, 5),  # an 8-core laptop running three other jobs
        (8, 0.0, 8, 2, 4),  # two processes of one run share the free cores
        (4, 0.0, 16, 1, 4),  # never more than torch's default
    ],
)
def test_auto_threads_leaves_the_busy_cores_alone(default, busy, cores, processes, expected):
    assert auto_threads(default, busy, cores, processes) == expected


def test_resolve_threads_takes_explicit_values_and_refuses_negative_ones():
    assert resolve_threads(3, default_threads=2) == 3
    assert resolve_threads(0, default_threads=2) == 2
    with pytest.raises(ValueError, match="num_threads"):
        resolve_threads(-1)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_busy_cores_sees_another_process_and_not_this_one():
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, args=(4.0,))
    spinner.start()
    try:
        time.sleep(1.0)  # the spawned interpreter has started and spins
        assert busy_cores(1.0) >= 0.7
    finally:
        spinner.terminate()
        spinner.join()


def test_torch_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1) as threads:
        assert threads == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
