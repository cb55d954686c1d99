"""``run_torchrun`` (``tests/_launch.py``), the two-process launcher of the sharded tests and benches: a rank that
dies by a signal (a native crash) gets one more launch; a Python exception in a rank fails at once."""

from __future__ import annotations

import textwrap
from pathlib import Path

from _launch import run_torchrun

# Rank 1 aborts (SIGABRT, as a C++ std::terminate would) while ``MARKER`` does not exist yet, then creates it.
_WORKER = """
import os, signal, sys
marker, mode = sys.argv[1], sys.argv[2]
if os.environ["RANK"] == "1":
    if mode == "raise":
        raise ValueError("a Python error in rank 1")
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGABRT)
with open(marker + f".done{os.environ['RANK']}", "w") as f:
    f.write("ok")
"""


def _worker(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_WORKER))
    return script


def test_a_rank_killed_by_a_signal_is_launched_once_more(tmp_path, capsys):
    marker = tmp_path / "crashed-once"
    result = run_torchrun(str(_worker(tmp_path)), [str(marker), "abort"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "crashed (Signal 6 (SIGABRT) received by PID" in capsys.readouterr().err
    assert (tmp_path / "crashed-once.done0").exists() and (tmp_path / "crashed-once.done1").exists()


def test_a_python_exception_in_a_rank_is_not_retried(tmp_path, capsys):
    marker = tmp_path / "raised"
    result = run_torchrun(str(_worker(tmp_path)), [str(marker), "raise"], timeout=120)
    assert result.returncode != 0
    assert "ValueError: a Python error in rank 1" in result.stderr
    assert "launching it again" not in capsys.readouterr().err
