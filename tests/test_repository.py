"""The repository's promises: README's first lines are the two commands, CI runs the README's test command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]


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
    assert "trl-reasoning = trl_reasoning.cli:main" in entry_points
