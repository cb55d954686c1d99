"""bench/_results.py and the --summarize guard: rebuilding a table from recorded runs loses nothing."""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from conftest import load_bench_script

# This module tests bench/'s shared modules: it loads them from bench/ (the rest of the suite imports nothing there).
_common = load_bench_script("_common")
_results = load_bench_script("_results")

SECTION = """# Benchmark results

## Speed

`python bench/overhead.py --steps 4 --seeds 0 1` — 2026-01-01 00:00 UTC — a machine

| arm | s/step |
|---|---:|
| a | 1.00 |

{marker}

A reading of the table, written by hand.

## Next

kept as it was
"""


def test_record_keeps_the_notes_and_under_summarize_the_command_that_made_the_runs(tmp_path, monkeypatch):
    path = tmp_path / "RESULTS.md"
    path.write_text(SECTION.format(marker=_results.NOTES_MARKER))
    monkeypatch.setattr(_results, "machine", lambda: "this machine")
    monkeypatch.setattr(sys, "argv", ["bench/overhead.py", "--summarize"])
    _results.record("Speed", "| arm | s/step |\n|---|---:|\n| a | 0.50 |", path=path)
    text = path.read_text()
    assert "| a | 0.50 |" in text and "| a | 1.00 |" not in text
    assert "A reading of the table, written by hand." in text and text.count(_results.NOTES_MARKER) == 1
    assert "`python bench/overhead.py --steps 4 --seeds 0 1` — table rebuilt" in text
    assert text.index("| a | 0.50 |") < text.index(_results.NOTES_MARKER) < text.index("## Next")
    assert text.rstrip().endswith("kept as it was")

    # A run that collects (no --summarize) records its own command; a section without the marker has no notes.
    path.write_text(SECTION.format(marker=""))
    monkeypatch.setattr(sys, "argv", ["bench/overhead.py", "--steps", "8"])
    _results.record("Speed", "| arm | s/step |\n|---|---:|\n| a | 0.25 |", path=path)
    text = path.read_text()
    assert "`python bench/overhead.py --steps 8` — 20" in text
    assert "written by hand" not in text and "kept as it was" in text


def test_summarize_without_matching_runs_names_the_recorded_keys(tmp_path):
    _common.require_recorded_runs(1, tmp_path / "runs.json", ["a/0/6"], ["a/0/4"])  # found: nothing raised
    with pytest.raises(SystemExit, match=r"runs\.json matches.*'a/0/6'.*recorded keys: a/0/4, a/1/4\..*RESULTS\.md"):
        _common.require_recorded_runs(0, tmp_path / "runs.json", ["a/0/6"], ["a/1/4", "a/0/4"])


def test_the_recorded_command_names_paths_relative_to_the_repository(monkeypatch):
    root = _results.ROOT
    argv = [str(root / "bench" / "async_memory.py"), "--before", str(root.parent / "before"), "--steps", "8"]
    argv += [f"--out={root / 'outputs' / 'memory'}", "runs/relative.json"]
    assert _results.recorded_command(argv) == (
        "python bench/async_memory.py --before ../before --steps 8 --out=outputs/memory runs/relative.json"
    )
    monkeypatch.chdir(root / "bench")  # run from bench/: still the script's path from the root
    assert _results.recorded_command(["async_memory.py", "--quick"]) == "python bench/async_memory.py --quick"


def test_no_recorded_command_names_a_folder_of_the_machine_that_ran_it():
    commands = re.findall(r"^`(.+?)` — ", _results.RESULTS.read_text(), re.M)
    assert len(commands) > 5  # the pattern finds the recorded commands, so the check below can fail
    absolute = [
        command for command in commands if any(word.split("=")[-1].startswith("/") for word in shlex.split(command))
    ]
    assert not absolute, absolute
