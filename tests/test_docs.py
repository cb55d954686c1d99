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
