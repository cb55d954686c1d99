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
