"""The two-process launcher of the sharded tests and benches (``bench/`` imports it from here, through
``bench/_common.py``): ``run_torchrun`` starts a script under ``torchrun`` with two gloo processes on a free local
port, offline and one thread per process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

#: How ``torchrun`` reports a rank that died by a signal (a native crash), not by a Python exception.
_KILLED_BY_SIGNAL = re.compile(r"Signal \d+ \(SIG\w+\) received by PID")


def run_torchrun(
    script: str, arguments: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run ``script arguments...`` under ``torchrun`` with two gloo processes on a free local port, offline and one
    thread per process. Returns the finished process (its return code is not checked here).

    A launch in which a rank died by a signal (SIGABRT, SIGSEGV: a crash in native code, reported by torchrun as
    ``Signal N (SIG...) received``) is started once more, and says so on stderr. The crash seen in CI
    (``terminate called without an active exception``) was a gloo process group left alive at interpreter exit;
    every worker now destroys its group before it exits (and a test of the CLI's launch checks that it does), so the
    retry is only a guard against native crashes in third-party runtimes (DeepSpeed's extensions on gloo). A Python
    exception in a rank is not retried: the failures our code can cause still fail the first time."""
    launch_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    launch_env.update(env or {})
    for attempt in (1, 2):
        with socket.socket() as sock:  # a free port per launch: parallel test workers never collide
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr"]
        command += ["127.0.0.1", "--master_port", str(port), script, *arguments]
        result = subprocess.run(command, env=launch_env, capture_output=True, text=True, timeout=timeout)
        if result.returncode == 0 or attempt == 2 or not _KILLED_BY_SIGNAL.search(result.stderr):
            return result
        crash = _KILLED_BY_SIGNAL.search(result.stderr).group(0)
        print(
            f"run_torchrun: a rank of {os.path.basename(script)} crashed ({crash}); launching it again",
            file=sys.stderr,
        )
    raise AssertionError("unreachable")
