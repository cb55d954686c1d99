"""No function over 60 lines in the package, the benchmarks or the scripts.

A function's length is counted as ``ast`` counts it: from its ``def`` line to its last line, decorators excluded,
docstring and comments included (``end_lineno - lineno + 1``); nested functions and methods count on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("trl_reasoning", "bench", "scripts")
MAX_FUNCTION_LINES = 60

#: (path, function name) -> why it is still longer for now. Each entry is a debt with a reason, not a licence.
ALLOWED_LONG_FUNCTIONS: dict[tuple[str, str], str] = {}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every function or method in ``source`` longer than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_long_functions_counts_from_def_to_last_line():
    """The counter itself: a 61-line function is reported (nested or not), a 60-line one is not."""
    body_60 = "def fits():\n" + "    x = 1\n" * 59
    body_61 = "def too_long():\n" + "    x = 1\n" * 60
    nested = "class Holder:\n    def method(self):\n" + "        x = 1\n" * 60
    assert long_functions(body_60) == []
    assert long_functions(body_61) == [("too_long", 1, 61)]
    assert long_functions(nested) == [("method", 2, 61)]


def test_no_function_over_60_lines():
    """Every function of trl_reasoning/, bench/ and scripts/ fits in 60 lines (the allow-list aside)."""
    offenders, allowed_seen = [], set()
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for name, line, length in long_functions(path.read_text(encoding="utf-8")):
                if (relative, name) in ALLOWED_LONG_FUNCTIONS:
                    allowed_seen.add((relative, name))
                    continue
                offenders.append(f"{relative}:{line} {name} ({length} lines)")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines (split them into named pieces): {offenders}"
    stale = set(ALLOWED_LONG_FUNCTIONS) - allowed_seen
    assert not stale, f"allowed long functions that are no longer long (remove them from the allow-list): {stale}"
