"""The tree shows the layers: imports inside ``trl_reasoning`` only point down, the pure math imports no trainer, and
``tests/`` mirrors the package (docs/architecture.md explains the floors)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_reasoning"

# Each top-level part of the package and its floor: a module may import from its own part and from lower floors only.
FLOORS = {
    "utils": 0,
    "rewards": 1,
    "algorithms": 2,
    "evaluation": 2,
    "models": 2,
    "tasks": 2,
    "async_generators": 2,
    "config": 3,
    "async_rollouts": 3,
    "trainer": 4,
    "presets": 5,
    "cli": 6,
    "demo": 6,
    "__init__": 7,
}
# Same-floor pairs that may import each other: the CLI runs the demo and the demo parses its arguments with the CLI's.
SAME_FLOOR_ALLOWED = {("cli", "demo"), ("demo", "cli")}
# Test folders that are not a part of the package: end-to-end user journeys cut across every layer.
CROSS_CUTTING_TEST_FOLDERS = {"journeys"}


def _part_of(parts: list[str]) -> str:
    return parts[0] if parts else "__init__"


def package_imports(package: Path = PACKAGE) -> list[tuple[str, str, str]]:
    """``(module path, importing part, imported part)`` for every import of one part of the package by another."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = parts[:-1] if is_package else parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = module if is_package else module[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl_reasoning"):
                target = node.module.split(".")[1:]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1:] for a in node.names if a.name.startswith("trl_reasoning.")]
                if not names:
                    continue
                target = names[0]
            else:
                continue
            source_part, target_part = _part_of(module), _part_of(target)
            if source_part != target_part:
                found.append((path.relative_to(package).as_posix(), source_part, target_part))
    return found


def upward_imports(imports: list[tuple[str, str, str]]) -> list[str]:
    """The imports that point up (or sideways without leave), described for the assertion message."""
    wrong = []
    for module, source, target in imports:
        if source not in FLOORS or target not in FLOORS:
            wrong.append(f"{module}: {source} -> {target} (a part with no floor: add it to FLOORS)")
        elif FLOORS[target] > FLOORS[source] or (
            FLOORS[target] == FLOORS[source] and (source, target) not in SAME_FLOOR_ALLOWED
        ):
            wrong.append(f"{module}: {source} (floor {FLOORS[source]}) imports {target} (floor {FLOORS[target]})")
    return wrong


def test_imports_inside_the_package_point_down():
    imports = package_imports()
    assert len(imports) > 50  # the walk found the package's imports, so the check below can fail
    assert not upward_imports(imports)


def test_the_check_catches_an_upward_import(tmp_path):
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "algorithms" / "__init__.py").write_text("")
    (tmp_path / "algorithms" / "losses.py").write_text("from ..trainer.base import ReasoningTrainer\n")
    (tmp_path / "config.py").write_text("from .algorithms import losses\n")
    assert upward_imports(package_imports(tmp_path)) == [
        "algorithms/losses.py: algorithms (floor 2) imports trainer (floor 4)"
    ]


def test_every_part_of_the_package_has_a_floor():
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert parts == set(FLOORS)


@pytest.mark.parametrize("part", ["algorithms", "rewards"])
def test_the_math_imports_no_trainer(part):
    """The pure layers import neither TRL's trainers nor transformers' ``Trainer``: they are tensors in, tensors out."""
    for path in sorted((PACKAGE / part).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in getattr(node, "names", [])]
            )
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for module in modules:
                    assert module.split(".")[0] not in {"trl", "transformers", "accelerate"}, (path, module)


def test_tests_mirror_the_package():
    parts = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} | {"cli"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - CROSS_CUTTING_TEST_FOLDERS <= parts, "a test folder with no package part of that name"
    assert parts <= folders, f"package parts without a test folder: {sorted(parts - folders)}"
    for part in parts:
        assert list((ROOT / "tests" / part).glob("test_*.py")), f"tests/{part}/ holds no test module"


#: The package's modules allowed past ~600 lines, each with its reason in docs/architecture.md ("Files over 600 lines,
#: and why"), and the bound it may not pass: a module that grows past it is cut along a seam or its bound argued there.
LONG_MODULES = {
    "config.py": 1055,
    "trainer/base.py": 895,
    "algorithms/losses.py": 720,
    "trainer/rollout.py": 650,
}
LINE_LIMIT = 600


def module_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """Each module of ``package`` (its path relative to it) and its number of lines."""
    return {path.relative_to(package).as_posix(): len(path.read_text().splitlines()) for path in package.rglob("*.py")}


def oversized_modules(lengths: dict[str, int]) -> list[str]:
    """The modules past their bound: ``LINE_LIMIT``, or their own in ``LONG_MODULES``."""
    return [
        f"{module}: {lines} lines (bound {LONG_MODULES.get(module, LINE_LIMIT)})"
        for module, lines in sorted(lengths.items())
        if lines > LONG_MODULES.get(module, LINE_LIMIT)
    ]


def test_no_module_is_long_without_a_reason():
    lengths = module_lengths()
    assert len(lengths) > 50
    assert not oversized_modules(lengths)
    assert oversized_modules({"async_rollouts/pipeline.py": 1166, "config.py": 961}) == [
        "async_rollouts/pipeline.py: 1166 lines (bound 600)"
    ]


def test_every_long_module_has_its_reason_in_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Files over 600 lines, and why", 1)[1]
    for module in LONG_MODULES:
        assert f"`{module.removeprefix('trl_reasoning/')}`" in section or f"`{module}`" in section, module
        assert module in module_lengths(), f"{module} no longer exists: drop it from LONG_MODULES"


def test_test_modules_outside_packages_have_unique_names():
    """pytest imports a test module of a folder without ``__init__.py`` by its bare name, so two of the same name
    (a ``test_registry.py`` under ``algorithms/`` and another under ``tasks/``, as there once were) cannot both be
    collected in one process: the second is an "import file mismatch" error."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            names.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    assert len(names) > 50
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def module_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: the package's modules it imports}`` by dotted path relative to the package (``async_rollouts.ahead``),
    imports inside ``if TYPE_CHECKING:`` included; a package's ``__init__`` is left out on both sides (it imports its
    modules to export their names, and ``from . import x`` names the module ``x``)."""
    modules = {".".join(path.relative_to(package).with_suffix("").parts) for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            continue
        name, targets = ".".join(parts), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = parts[:-1][: len(parts) - node.level]
            target = base + (node.module.split(".") if node.module else [])
            for candidate in [".".join(target + [alias.name]) for alias in node.names] + [".".join(target)]:
                if candidate in modules and not candidate.endswith("__init__"):
                    targets.add(candidate)
                    break
        graph[name] = targets - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph`` among modules of one part (each found once, from its first module in order)."""
    circles, done = [], set()

    def walk(module: str, trail: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target.split(".")[0] != trail[0].split(".")[0]:
                continue  # another part: the floors keep those pointing down
            if target in trail:
                circle = trail[trail.index(target) :]
                if frozenset(circle) not in done:
                    done.add(frozenset(circle))
                    circles.append([*circle, target])
            elif len(trail) < 12:
                walk(target, [*trail, target])

    for module in sorted(graph):
        walk(module, [module])
    return circles


def test_no_part_of_the_package_has_an_import_circle():
    """Inside each part the modules import each other in one direction, type-only imports counted: a generator backend
    is handed the trainer and the weight transport it reads, not the facade that chose it."""
    assert import_circles(module_imports()) == []
    assert import_circles({"a.x": {"a.y"}, "a.y": {"a.x"}}) == [["a.x", "a.y", "a.x"]], "the check finds a circle"


_NOQA_F401 = re.compile(r"#\s*noqa:[^#\n]*\bF401\b")


def _module_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's top-level statements, with those inside its top-level ``if`` / ``try`` / ``with`` blocks."""
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (
                node.body,
                getattr(node, "orelse", []),
                getattr(node, "finalbody", []),
                *[handler.body for handler in getattr(node, "handlers", [])],
            ):
                found += _module_statements(block)
    return found


def reexported_names(source: str) -> list[str]:
    """The names a module's ``__all__`` lists but the module does not define (by ``def``, ``class`` or assignment),
    and the names it imports with a ``# noqa: F401`` marker (imported for others to import from it)."""
    statements = _module_statements(ast.parse(source).body)
    lines = source.splitlines()
    defined, exported, found = set(), [], []
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
            if "__all__" in names and node.value is not None:
                exported += [name for name in ast.literal_eval(node.value) if isinstance(name, str)]
            defined |= names
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(_NOQA_F401.search(line) for line in lines[node.lineno - 1 : node.end_lineno]):
                found += [alias.asname or alias.name.split(".")[0] for alias in node.names]
    return found + [name for name in exported if name not in defined]


def test_a_module_exports_only_the_names_it_defines():
    """One home per name: a module's ``__all__`` lists only what it defines, and it imports nothing just to be imported
    from (``# noqa: F401``); an importer imports a name from the module that defines it. A package's ``__init__`` is
    the exception: it exports its package's public names."""
    modules = {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py"
    }
    assert len(modules) > 50
    found = {module: names for module, source in modules.items() if (names := reexported_names(source))}
    assert found == {}, f"names exported from a module that does not define them: {found}"


def test_the_check_catches_a_reexport():
    marker = "#" + " noqa: F401"  # built, so that ruff does not take it for a directive of this file
    source = (
        f"from .a import b  {marker}\n"
        f"from .c import (  {marker} - re-exported\n    d,\n)\n"
        "from .e import f\n"
        "if True:\n    G = 1\n"
        "def h(): ...\n"
        "__all__ = ['G', 'f', 'h']\n"
    )
    assert reexported_names(source) == ["b", "d", "f"]
