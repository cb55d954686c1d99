"""Shared by the bench scripts: write a result table into bench/RESULTS.md with its command, date and machine; keep a
script's recorded runs in its JSON file (:func:`read_runs`, :func:`save_run`); say how busy the machine is
(:func:`load_average`)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
#: The repository's root: the recorded commands name paths relative to it.
ROOT = Path(__file__).resolve().parents[1]
#: In a section, what follows this line was written by hand (a reading of the table) and survives a rewrite.
NOTES_MARKER = "<!-- notes: written by hand, kept when the script rewrites the table above -->"


def read_runs(path: Path) -> dict:
    """The runs recorded in ``path`` by key (none yet: ``{}``). Read anew at each call: another invocation of the
    script may have recorded one meanwhile."""
    return json.loads(path.read_text()) if path.exists() else {}


def save_run(path: Path, key: str, value: dict) -> None:
    """Record ``value`` as the run ``key`` of ``path``, keeping every other run recorded there."""
    runs = read_runs(path)
    runs[key] = value
    path.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")


def load_average() -> str:
    """How busy the machine is, for a table's caption (timed runs want a quiet one)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} CPU threads"


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{cpu}, {os.cpu_count()} CPU threads, {device}, torch {torch.__version__}, Python {platform.python_version()}"
    )


def recorded_command(argv: list[str]) -> str:
    """``argv`` (a script and its arguments) as RESULTS.md records it: ``python <script>`` with the script and every
    absolute path among the arguments (alone or as ``--flag=/path``) relative to the repository's root, so that a
    recorded command names no folder of the machine that ran it (``--before /work/main`` from a checkout next to it
    is ``--before ../main``)."""

    def relative(argument: str) -> str:
        flag, equals, value = argument.partition("=") if argument.startswith("-") else ("", "", argument)
        return flag + equals + (os.path.relpath(value, ROOT) if os.path.isabs(value) else value)

    script = os.path.relpath(os.path.abspath(argv[0]), ROOT)
    return shlex.join(["python", script, *map(relative, argv[1:])])


def record(section: str, table: str, command: str | None = None, path: Path = RESULTS) -> None:
    """Replace (or append) the ``## section`` of ``path`` with ``table`` and the command that produced it (by
    default this process's command line; under ``--summarize``, the command that made the runs). Notes below
    :data:`NOTES_MARKER` in the old section are kept."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\nWritten by the scripts in `bench/`.\n"
    pattern = re.compile(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    old = pattern.search(text)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if command is None:
        command = recorded_command(sys.argv)
        ran = old and re.search(r"^`(.+?)` — ", old.group(0), re.M)
        if "--summarize" in sys.argv[1:] and ran and "--summarize" not in ran.group(1):
            # Only the table was rebuilt: the command that made the runs is still the one a reader needs.
            command, stamp = ran.group(1), f"table rebuilt {stamp} from the recorded runs"
    body = f"## {section}\n\n`{command}` — {stamp} — {machine()}\n\n{table.strip()}\n"
    if old and NOTES_MARKER in old.group(0):
        body += "\n" + NOTES_MARKER + old.group(0).split(NOTES_MARKER, 1)[1].rstrip() + "\n"
    text = pattern.sub(lambda _: body + "\n", text) if old else text.rstrip() + "\n\n" + body
    path.write_text(text.rstrip() + "\n")
