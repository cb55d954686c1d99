"""The generator process (``async_generator="process"``) never outlives its trainer.

A real training script runs in a subprocess whose output is piped, as a scheduler, ``python train.py | tee log`` or a
CI log runs it. Killed mid-run (SIGKILL: an OOM kill, a scheduler; SIGTERM: ``kill PID``, ``docker stop``), none of
its descendants is alive a few seconds later, the shared-memory files they mapped are gone, and its output reaches
its end (no child holds the pipe). Ctrl-C while the worker is still starting is a plain ``KeyboardInterrupt``:
no worker, not even a zombie, and no error of the worker on the terminal.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

SCRIPT = Path(__file__).with_name("lifetime_trainer.py")
TESTS = Path(__file__).parents[1]
REPOSITORY = Path(__file__).parents[2]


class Trainer:
    """The script in a subprocess of its own session, its output (stdout and stderr) read line by line."""

    def __init__(self, model_path: str, output_dir: Path):
        pythonpath = os.pathsep.join(filter(None, [str(TESTS), str(REPOSITORY), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), model_path, str(output_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)  # end of file

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("the trainer ended early:\n" + "\n".join(self.lines[-40:]))
            self.lines.append(line)
            if line == text:
                return
        raise AssertionError(f"no {text!r} within {timeout} s:\n" + "\n".join(self.lines[-40:]))

    def output_ends_within(self, seconds: float) -> bool:
        self._reader.join(timeout=seconds)
        while not self._queue.empty():
            line = self._queue.get()
            if line is not None:
                self.lines.append(line)
        return not self._reader.is_alive()

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _shared_memory_files(processes: list[psutil.Process]) -> set[str]:
    """The /dev/shm files the processes map (torch's shared blocks, multiprocessing's semaphores)."""
    files = set()
    for process in processes:
        try:
            files |= {
                m.path.removesuffix(" (deleted)") for m in process.memory_maps() if m.path.startswith("/dev/shm")
            }
        except psutil.Error:
            pass
    return files


def _worker_of(processes: list[psutil.Process]) -> list[psutil.Process]:
    found = []
    for process in processes:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "multiprocessing" in command and "resource_tracker" not in command:
            found.append(process)
    return found


def _gone_within(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in processes):
        time.sleep(0.1)
    return [p for p in processes if _alive(p)]


def _kill_left_behind(processes: list[psutil.Process]) -> None:
    for process in processes:  # by id: only what this test started
        if _alive(process):
            process.kill()


@pytest.mark.slow
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_trainer_leaves_no_generator_shared_memory_or_open_output(signal_number, tiny_model_path, tmp_path):
    trainer = Trainer(tiny_model_path, tmp_path / "out")
    descendants: list[psutil.Process] = []
    try:
        trainer.wait_for_line("STEP 2", timeout=240)  # the worker runs; the trainer is busy for a minute
        time.sleep(8)  # the worker samples the batches it was sent and waits for more: idle, as it is most of a run
        descendants = trainer.descendants()
        assert _worker_of(descendants), f"no generator process among {descendants}"
        mapped = _shared_memory_files([psutil.Process(trainer.process.pid), *descendants])
        assert mapped, "the trainer and its worker map no shared memory: the check below would be vacuous"
        os.kill(trainer.process.pid, signal_number)
        assert trainer.process.wait(timeout=30) == -signal_number
        assert trainer.output_ends_within(10), "a child of the killed trainer still holds its stdout"
        assert _gone_within(descendants, 10) == [], "a child of the killed trainer is still alive"
        assert sorted(path for path in mapped if os.path.exists(path)) == []
    finally:
        _kill_left_behind(descendants)
        if trainer.process.poll() is None:
            trainer.process.kill()
            trainer.process.wait()


@pytest.mark.slow
def test_ctrl_c_while_the_worker_starts_is_a_clean_keyboard_interrupt(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_model_path, tmp_path / "out")
    descendants: list[psutil.Process] = []
    try:
        trainer.wait_for_line("TRAINING STARTS", timeout=240)
        deadline = time.monotonic() + 120
        while not _worker_of(trainer.descendants()):
            assert time.monotonic() < deadline, "the generator process never started"
            time.sleep(0.05)
        time.sleep(0.5)  # spawned, importing torch: seconds before it can answer
        descendants = trainer.descendants()
        os.killpg(trainer.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
        assert trainer.process.wait(timeout=60) == 0
        assert trainer.output_ends_within(10)
        output = "\n".join(trainer.lines)
        assert "INTERRUPTED" in output and "GeneratorProcess" in output, output[-3000:]  # during its start-up
        assert "GENERATOR False" in output and "CHILDREN []" in output, output[-3000:]
        assert "FileNotFoundError" not in output and "Traceback" not in output.split("INTERRUPTED")[0], output[-3000:]
        assert _gone_within(descendants, 10) == []
    finally:
        _kill_left_behind(descendants)
        if trainer.process.poll() is None:
            trainer.process.kill()
            trainer.process.wait()
