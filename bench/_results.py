"""Shared by the bench scripts: write a result table into bench/RESULTS.md with its command, date and machine."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


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


def record(section: str, table: str, command: str | None = None, path: Path = RESULTS) -> None:
    """Replace (or append) the ``## section`` of ``path`` with ``table`` and the command that produced it (by
    default this process's command line)."""
    if command is None:
        command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = f"## {section}\n\n`{command}` — {stamp} — {machine()}\n\n{table.strip()}\n"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nWritten by the scripts in `bench/`.\n"
    pattern = re.compile(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: body + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + body
    path.write_text(text.rstrip() + "\n")
