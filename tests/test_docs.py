"""The documentation: README.md is a landing page, the site under docs/ builds with ``mkdocs build --strict``, and
every link of README.md and docs/*.md leads somewhere real, down to the heading."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_repository import _github_anchor, _headings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Links from docs/ to files outside it are written as this repository's GitHub addresses (see mkdocs.yml).
GITHUB = "https://github.com/trl-reasoning/trl-reasoning"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _links(markdown: str) -> list[str]:
    """The targets of the inline links of ``markdown``, outside fenced code blocks and code spans."""
    prose, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            prose.append(re.sub(r"`[^`]*`", "", line))
    return _LINK.findall("\n".join(prose))


def _problem(document: Path, target: str) -> str | None:
    """Why ``target``, a link of ``document``, leads nowhere (``None`` when it resolves)."""
    if target.startswith(GITHUB):
        rest = target[len(GITHUB) :]
        path, _, anchor = rest.partition("#")
        match = re.fullmatch(r"(?:/(?:blob|tree)/main/(?P<path>.+))?/?", path)
        if match is None:
            return "a GitHub address that is not a file of the main branch"
        resolved = ROOT / match.group("path") if match.group("path") else ROOT / "README.md"
    elif re.match(r"[a-z]+:", target):
        return None  # another site: not checked offline
    else:
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if document.parent == DOCS and DOCS not in resolved.parents:
            return f"leaves docs/, which the site does not publish: link to {GITHUB}/blob/main/... instead"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md":
        anchors = {_github_anchor(heading) for heading in _headings(resolved.read_text())}
        if anchor not in anchors:
            return f"no heading #{anchor} in {resolved.relative_to(ROOT).as_posix()}"
    return None


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.count("<!-- presets:start -->") == 1 and readme.count("<!-- presets:end -->") == 1
    assert "## Not yet here" in readme
    linked = {target.partition("#")[0] for target in _links(readme)}
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md") if page.name != "index.md"}
    assert sorted(pages - linked) == [], "pages of docs/ the README does not link to"


def test_every_link_of_the_readme_and_the_docs_resolves():
    broken = []
    for document in _documents():
        for target in _links(document.read_text()):
            problem = _problem(document, target)
            if problem is not None:
                broken.append((document.relative_to(ROOT).as_posix(), target, problem))
    assert not broken, broken


@pytest.mark.parametrize(
    "target, why",
    [
        ("missing-page.md", "no such file"),
        ("architecture.md#no-such-heading", "no heading"),
        ("../bench/RESULTS.md", "leaves docs/"),
        (f"{GITHUB}/blob/main/bench/NO_SUCH_FILE.md", "no such file"),
    ],
)
def test_a_broken_link_is_found(target, why):
    assert why in _problem(DOCS / "index.md", target)


def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra, part of `dev`)")
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    for page in ("index.html", "architecture/index.html", "RELIABILITY/index.html", "presets/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


@pytest.mark.parametrize(
    "change, expected",
    [
        ("[a page](missing-page.md)", "missing-page.md"),
        ("[a heading](architecture.md#no-such-heading)", "no-such-heading"),
        (None, 'not included in the "nav"'),
    ],
    ids=["missing page", "missing heading", "page outside the nav"],
)
def test_the_strict_build_fails_on_a_broken_site(tmp_path, change, expected):
    """mkdocs.yml's validation settings make strict mode fail on each kind of mistake, not only warn."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra, part of `dev`)")
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    if change is None:
        (tmp_path / "docs" / "stray.md").write_text("# A page no one listed\n")
    else:
        page = tmp_path / "docs" / "index.md"
        page.write_text(page.read_text() + f"\n{change}\n")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr[-4000:]


def _walk_rows() -> list[list[str]]:
    """The rows of docs/extending.md's table of walks, as cells."""
    text = (DOCS / "extending.md").read_text()
    table = text.split("| to add |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]


def _source_lines(path: str) -> int:
    """``wc -l`` of a file the walks name, relative to the repository or to the package."""
    for candidate in (ROOT / path, ROOT / "trl_reasoning" / path):
        if candidate.is_file():
            return len(candidate.read_text().splitlines())
    raise AssertionError(f"docs/extending.md names {path}, which is not a file of the repository")


def test_the_walks_of_extending_count_what_the_repository_holds():
    """Each walk's "read" cell gives each file's length (a whole file within 10% of ``wc -l``, a part ``~N`` at most
    its file) and a total whose files and lines add up; its "touch" cell lists the edits, as many as it counts, and
    the edits of a preset are as many as the preset's own walk lists."""
    rows = _walk_rows()
    assert len(rows) == 5, rows
    preset_edits = next(touch for what, _, touch, *_ in rows if what == "a preset over existing pieces").rsplit(
        ": ", 1
    )[1]
    assert f"then the {preset_edits} edits of a preset" in rows[0][2]
    for what, read, touch, *_ in rows:
        listed = re.findall(r"`([\w/.]+\.py)`((?:(?!`[\w/.]+\.py`)[^()])*?)\((~?)([\d,]+)\)", read)
        assert listed, f"{what}: no file with its line count in {read!r}"
        counted = 0
        for path, _, approximate, lines in listed:
            lines, actual = int(lines.replace(",", "")), _source_lines(path)
            if approximate:
                assert lines <= actual, f"{what}: {path} has {actual} lines, fewer than the part counted ({lines})"
            else:
                assert abs(lines - actual) <= max(3, actual // 10), f"{what}: {path} has {actual} lines, not {lines}"
            counted += lines
        files, total = re.search(r"(\d+) files?, ~([\d,]+) lines$", read).groups()
        assert int(files) == len({path for path, *_ in listed}), f"{what}: {files} files counted in {read!r}"
        assert abs(int(total.replace(",", "")) - counted) <= counted // 10, (
            f"{what}: {total} lines, the parts add {counted}"
        )
        edits, count = touch.rsplit(": ", 1)
        # "the 7 edits of a preset below": a walk that ends in another counts that one's edits
        listed_edits = sum(
            int(m.group(1)) if (m := re.match(r"then the (\d+) edits", item)) else 1 for item in edits.split("; ")
        )
        assert int(count) == listed_edits, f"{what}: {count} edits counted in {touch!r}"
