"""Generated blocks in the documentation: the lines between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in
README.md or one of docs/*.md (wherever the block lives now), which ``scripts/*_table.py --write`` rewrites."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def markers(name: str) -> tuple[str, str]:
    """The start and end marker lines of the block ``name``."""
    return f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"


def block_file(name: str, root: Path = ROOT) -> Path:
    """The one file of README.md and docs/*.md that holds the block ``name``; none or several is an error."""
    start, _ = markers(name)
    candidates = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    holders = [path for path in candidates if path.is_file() and start in path.read_text()]
    if len(holders) != 1:
        raise ValueError(
            f"the block {start.strip()} must be in exactly one of README.md and docs/*.md; found it in "
            f"{[str(path.relative_to(root)) for path in holders] or 'none'}"
        )
    return holders[0]


def read_block(name: str, root: Path = ROOT) -> tuple[Path, str]:
    """``(the file, the text between the markers)`` of the block ``name``."""
    path = block_file(name, root)
    start, end = markers(name)
    return path, path.read_text().split(start, 1)[1].split(end, 1)[0]


def write_block(name: str, text: str, root: Path = ROOT) -> Path:
    """Replace the text between the markers of the block ``name`` with ``text``; return the file written."""
    path, old = read_block(name, root)
    start, end = markers(name)
    path.write_text(path.read_text().replace(start + old + end, start + text + end, 1))
    return path
