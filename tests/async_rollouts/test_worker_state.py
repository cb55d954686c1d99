"""A stopped generator worker (``async_generator="process"``) is an error within seconds, not at ``async_timeout``.

A worker stopped by SIGSTOP neither answers nor dies: the trainer used to wait the whole ``async_timeout`` (600 s by
default) and then blame slow generation, and ``close()`` waited 10 s more for it. These tests drive
``GeneratorProcess``'s wait and close on a plain child process (no torch in it, so they take seconds); the trainer's
own test is ``tests/async_rollouts/test_async_rollouts.py::test_a_worker_that_dies_or_hangs_is_a_clear_error``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time

import pytest

from trl_reasoning.async_rollouts import process_generator
from trl_reasoning.async_rollouts.process_generator import STOPPED_GRACE_SECONDS, GeneratorProcess, process_state
from trl_reasoning.async_rollouts.protocols import GeneratorError


@pytest.fixture
def child():
    """A child process that sleeps (a worker waiting for jobs), killed and reaped at the end."""
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(120,), daemon=True)
    process.start()
    yield process
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=10)


def _state_becomes(pid: int, expected: str | None, seconds: float = 5.0) -> str | None:
    """The state of ``pid`` once it is ``expected`` (a signal takes effect shortly after ``kill`` returns)."""
    deadline = time.monotonic() + seconds
    while (state := process_state(pid)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return state


def _generator_over(process, timeout: float = 60.0) -> GeneratorProcess:
    """A ``GeneratorProcess`` whose worker is ``process`` (started already, its ready message taken)."""
    generator = object.__new__(GeneratorProcess)
    generator.timeout, generator.log_path, generator._ready = timeout, None, True
    generator._done, generator.submitted, generator._process = {}, set(), process
    generator._jobs, generator._results = queue.Queue(), queue.Queue()
    return generator


@pytest.mark.parametrize("source", ["proc", "psutil"])
def test_the_state_of_a_process_is_read_running_stopped_zombie_or_gone(source, child, monkeypatch):
    if source == "psutil":  # where there is no /proc (macOS): psutil, which accelerate installs

        def no_proc(*args, **kwargs):
            raise FileNotFoundError("no /proc here")

        monkeypatch.setattr(process_generator, "open", no_proc, raising=False)
    elif not os.path.exists(f"/proc/{child.pid}/stat"):
        pytest.skip("no /proc on this system")
    assert process_state(child.pid) == "running"
    os.kill(child.pid, signal.SIGSTOP)
    assert _state_becomes(child.pid, "stopped") == "stopped"
    os.kill(child.pid, signal.SIGCONT)
    assert _state_becomes(child.pid, "running") == "running"
    os.kill(child.pid, signal.SIGKILL)
    assert _state_becomes(child.pid, "zombie") == "zombie"  # exited, not reaped yet
    child.join(timeout=10)
    assert process_state(child.pid) is None


def test_a_stopped_worker_is_reported_as_stopped_within_seconds(child):
    generator = _generator_over(child, timeout=60.0)
    os.kill(child.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(GeneratorError, match=rf"generator worker \(pid {child.pid}\) is stopped \(SIGSTOP") as error:
        generator._wait_for(3)
    waited = time.monotonic() - started
    assert STOPPED_GRACE_SECONDS <= waited < STOPPED_GRACE_SECONDS + 3, waited
    message = str(error.value)
    assert "generation step 3" in message and f"kill -STOP {child.pid}" in message
    assert "resume_from_checkpoint" in message and "Raise async_timeout" not in message


def test_a_worker_stopped_for_an_instant_is_waited_for(child):
    """A job suspended and resumed whole (the trainer and the worker continued by one signal) may show the worker
    stopped for an instant: a worker stopped for a second is waited for, only one stopped for
    ``STOPPED_GRACE_SECONDS`` is an error."""
    generator = _generator_over(child, timeout=60.0)
    os.kill(child.pid, signal.SIGSTOP)
    assert _state_becomes(child.pid, "stopped") == "stopped"

    def continue_and_answer() -> None:
        time.sleep(1.2)  # seen stopped by the wait's first three checks
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(1.0)
        generator._results.put((3, [[1]], [[-0.5]], 0.1))

    answer = threading.Thread(target=continue_and_answer)
    answer.start()
    try:
        assert generator._wait_for(3) == ([[1]], [[-0.5]], 0.1)
    finally:
        answer.join()


def test_closing_a_stopped_worker_kills_it_at_once(child):
    generator = _generator_over(child)
    os.kill(child.pid, signal.SIGSTOP)
    assert _state_becomes(child.pid, "stopped") == "stopped"
    started = time.monotonic()
    generator.close()
    assert time.monotonic() - started < 3, "close() waited for a worker that cannot read its queue"
    assert not child.is_alive() and child.exitcode == -signal.SIGKILL
