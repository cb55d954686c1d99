"""The repository's promises: README's first lines are the two commands, CI runs the README's test command, and
every document the package's docstrings and comments point to is in the repository, down to the section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
ALGORITHMS = "docs/algorithms.md"


def _readme_commands() -> list[str]:
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    return [line.strip() for line in lines[:15] if line.strip().startswith("bash scripts/bootstrap.sh")]


def test_readme_starts_with_the_main_job_and_the_test_command():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "trl_reasoning.demo" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = ROOT.joinpath(".ci", "run").read_text()
    assert _readme_commands()[1] in ci.splitlines()
    assert "set -euo pipefail" in ci  # a failing test fails CI


def test_changelog_has_an_unreleased_section():
    changelog = ROOT.joinpath("CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog") and "## [Unreleased]" in changelog


def test_the_built_wheel_has_the_package_its_types_and_trls_constraints(tmp_path):
    """Build the wheel as pip would (no network: the build backend is already installed) and read what it ships."""
    import email
    import shutil
    import subprocess
    import sys
    import zipfile

    # From a copy of what the sdist holds, so that no build/ folder is left in (or read from) the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "trl_reasoning", source / "trl_reasoning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "recipes", source / "recipes")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("trl_reasoning-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
        (entry_points_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(entry_points_name).decode()
    modules = {
        f"trl_reasoning/{p.relative_to(ROOT / 'trl_reasoning').as_posix()}" for p in ROOT.glob("trl_reasoning/**/*.py")
    }
    assert modules <= names, sorted(modules - names)
    assert "trl_reasoning/py.typed" in names
    recipes = {
        f"trl_reasoning/recipes/{p.relative_to(ROOT / 'recipes').as_posix()}" for p in ROOT.glob("recipes/**/*.*")
    }
    assert recipes <= names, sorted(recipes - names)  # reachable from an install (`trl-reasoning recipes`)
    assert not any(name.startswith("tests/") for name in names)
    assert metadata["Requires-Python"] == ">=3.11"
    requires = metadata.get_all("Requires-Dist")
    assert "trl<1.17.0,>=1.16.0" in requires
    assert 'trl[vllm]; extra == "vllm"' in requires and 'trl[quantization]; extra == "quantization"' in requires
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert "trl-reasoning = trl_reasoning.demo.quiet:console_main" in entry_points


# A path ending in .md (``docs/algorithms.md``, ``recipes/README.md``, ``bench/RESULTS.md``), not part of a longer
# word or path on either side.
_MD_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)(?![\w-])")
# A pointer into docs/algorithms.md and the section it names: an anchor (``docs/algorithms.md#loss-aggregation``)
# and/or a quoted heading right after it (``docs/algorithms.md`` ("Loss aggregation") or ``docs/algorithms.md``, "...").
_ALGORITHMS_POINTER = re.compile(
    r"docs/algorithms\.md(?:#(?P<anchor>[\w-]+))?`*(?:\s*[,(]\s*\(?\s*\"(?P<name>[^\"]+)\")?"
)
# What the package's modules point to today: a pointer dropped or renamed must be reconsidered here, so the check below
# can never pass by finding nothing.
_KNOWN_POINTERS = {
    ("algorithms/advantages.py", "Advantage estimators"),
    ("algorithms/losses.py", "Per-token policy objectives"),
    ("algorithms/aggregation.py", "Loss aggregation"),
    ("algorithms/batch.py", "Loss aggregation"),
    ("algorithms/shaping.py", "Task reward"),
    ("algorithms/logprobs.py", "DPPO's divergence mask"),
}


def _joined_lines(text: str) -> str:
    """``text`` with each line break (and the ``#`` of a continued comment) read as one space, so that a section name
    wrapped over two docstring or comment lines is found whole."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#[ \t]*)?", " ", text)


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(markdown: str) -> list[str]:
    """The ATX headings of ``markdown`` (outside fenced code blocks), without their ``#`` marks."""
    headings, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} +(.+?) *#* *$", line)):
            headings.append(match.group(1))
    return headings


def test_every_markdown_file_the_package_cites_exists():
    cited = {}
    for module in sorted(ROOT.glob("trl_reasoning/**/*.py")):
        for path in _MD_PATH.findall(module.read_text()):
            cited.setdefault(path, []).append(module.relative_to(ROOT).as_posix())
    missing = {path: modules for path, modules in cited.items() if not (ROOT / path).is_file()}
    assert not missing, f"trl_reasoning cites Markdown files the repository does not have: {missing}"
    assert ALGORITHMS in cited and "recipes/README.md" in cited, sorted(cited)


def test_every_section_of_the_algorithms_page_the_package_cites_exists():
    headings = _headings((ROOT / ALGORITHMS).read_text())
    anchors = {_github_anchor(heading) for heading in headings}
    found, unnamed, wrong = set(), [], []
    for module in sorted(ROOT.glob("trl_reasoning/**/*.py")):
        name = module.relative_to(ROOT / "trl_reasoning").as_posix()
        for match in _ALGORITHMS_POINTER.finditer(_joined_lines(module.read_text())):
            anchor, section = match.group("anchor"), match.group("name")
            if anchor is None and section is None:
                unnamed.append(name)
            if anchor is not None and anchor not in anchors:
                wrong.append((name, f"#{anchor}"))
            if section is not None:
                section = " ".join(section.split())
                found.add((name, section))
                if section not in headings:
                    wrong.append((name, section))
    assert not unnamed, f"pointers to {ALGORITHMS} that name no section (add its heading in quotes): {unnamed}"
    assert not wrong, f"sections of {ALGORITHMS} cited but not there (headings: {headings}): {wrong}"
    assert _KNOWN_POINTERS <= found, sorted(_KNOWN_POINTERS - found)


def test_the_algorithms_page_and_the_readme_link_to_what_exists():
    """Relative links resolve, and every anchor into the algorithms page names one of its headings."""
    anchors = {_github_anchor(heading) for heading in _headings((ROOT / ALGORITHMS).read_text())}
    broken = []
    for document in ("README.md", ALGORITHMS):
        for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / document).read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            resolved = (ROOT / document).parent / path if path else ROOT / document
            if not resolved.exists():
                broken.append((document, target))
            elif anchor and resolved.resolve() == (ROOT / ALGORITHMS).resolve() and anchor not in anchors:
                broken.append((document, target))
    assert not broken, broken
    assert f"]({ALGORITHMS})" in (ROOT / "README.md").read_text()


def test_the_suite_imports_nothing_from_bench():
    """Editing a benchmark cannot break the suite: only the tests of the bench scripts (``test_bench_*.py``, through
    ``conftest.load_bench_script``) import from ``bench/``; the launcher and the sharding strategies that tests and
    benches share live in ``tests/`` (``_launch.py``, ``_sharding.py``)."""
    import ast

    bench_modules = {path.stem for path in (ROOT / "bench").glob("*.py")}
    assert {"_common", "_results", "evidence_real"} <= bench_modules
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name.startswith("test_bench_"):
            continue
        tree = ast.parse(path.read_text())
        loader = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_bench_script"]
        allowed = {id(n) for function in loader for n in ast.walk(function)}  # what test_bench_*.py call
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] in bench_modules]
            code = ast.unparse(node) if isinstance(node, (ast.Call, ast.Assign)) else ""
            if code.startswith("sys.path") and "bench" in code.lower() and id(node) not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {code}")
    assert not found


#: The repository's top-level folders: a path that starts with one of them (``bench/overhead.py``, ``docs/testing.md``,
#: ``trl_reasoning/cli/``) is a path into this repository.
_TOP_FOLDERS = ("trl_reasoning", "tests", "bench", "scripts", "recipes", "docs", "examples")
_REPOSITORY_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(_TOP_FOLDERS)})/[\w./-]*\w)")
#: Paths of that shape that name something else, each with what it is: another project's file, or the wheel's layout.
#: A file outside the repository (a path up from it, or in a "shared" folder beside it): the project cites its own docs.
_OUTSIDE = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-]+/[\w./-]*\w|shared/[\w./-]*\w)")
_NOT_THIS_REPOSITORY = {
    "examples/dppo_trainer/run_qwen30b_dppo.sh": "sail-sg/Stable-RL's launch script (DPPO's authors)",
    "examples/scripts": "OpenRLHF's examples folder",
    "tests/test_grpo_trainer.py": "TRL's test file",
    "trl_reasoning/recipes": "where the wheel installs recipes/",
}


def _docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of a Python file, or of every comment of a YAML or shell file."""
    import ast
    import io
    import tokenize

    text = path.read_text()
    if path.suffix != ".py":
        return [(n, line.partition("#")[2]) for n, line in enumerate(text.splitlines(), 1) if "#" in line]
    found = [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append((first.lineno, first.value.value))
    return found


def _exists(cited: str) -> bool:
    """Whether the repository has ``cited``, read as a path or as ``module.attribute`` (``tests/_launch.run_torchrun``)."""
    module, _, attribute = cited.rpartition(".")
    return (ROOT / cited).exists() or bool(module and attribute.isidentifier() and (ROOT / f"{module}.py").is_file())


def test_every_repository_path_a_docstring_or_comment_names_exists():
    """A docstring or comment in trl_reasoning/, tests/, bench/, scripts/ or recipes/ that names a file of this
    repository (a script, a test, a page of docs/) sends the reader to something that is there."""
    cited: dict[str, list[str]] = {}
    for folder in ("trl_reasoning", "tests", "bench", "scripts", "recipes"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".yaml", ".yml", ".sh") or "__pycache__" in path.parts:
                continue
            for line, text in _docstrings_and_comments(path):
                for name in _REPOSITORY_PATH.findall(text) + _OUTSIDE.findall(text):
                    cited.setdefault(name, []).append(f"{path.relative_to(ROOT).as_posix()}:{line}")
    assert len(cited) > 50 and "docs/algorithms.md" in cited  # the walk finds the citations, so the check can fail
    missing = {
        name: where
        for name, where in cited.items()
        if _OUTSIDE.fullmatch(name) or (not _exists(name) and name not in _NOT_THIS_REPOSITORY)
    }
    assert not missing, f"paths named in docstrings or comments that the repository does not have: {missing}"
    assert set(_NOT_THIS_REPOSITORY) <= set(cited), "an exception no longer cited: drop it from _NOT_THIS_REPOSITORY"
