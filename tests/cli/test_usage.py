"""``trl-reasoning --help`` lists every algorithm subcommand without importing a preset, TRL or torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trl_reasoning.cli.arguments import TRAINERS
from trl_reasoning.cli.usage import ALGORITHM_COMMANDS, usage


def test_the_written_list_is_the_trainers_table():
    """A preset added, removed or renamed fails here until ``cli/usage.py``'s list says the same."""
    derived = tuple((name, trainer.__name__, config.__name__) for name, (config, trainer) in TRAINERS.items())
    assert ALGORITHM_COMMANDS == derived
    for name, trainer, config in derived:
        assert f"  {name:<10} train with {trainer} ({config})" in usage()


def test_the_console_help_imports_no_preset_trl_or_torch():
    """The console script's ``--help`` prints the usage from names alone: none of the heavy modules is imported."""
    script = (
        "import sys\n"
        "sys.argv = ['trl-reasoning', '--help']\n"
        "from trl_reasoning.demo.quiet import console_main\n"
        "console_main()\n"
        "heavy = [m for m in ('torch', 'trl', 'transformers', 'trl_reasoning.presets') if m in sys.modules]\n"
        "print('imported:', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert "usage: trl-reasoning <command>" in result.stdout
    assert "imported: []" in result.stdout
    assert result.stderr == ""


def test_the_lazy_cli_package_answers_its_names_and_modules():
    """``trl_reasoning.cli`` imports its parts on first use; every exported name and module is still an attribute."""
    import trl_reasoning.cli as cli

    for name in cli.__all__:
        assert getattr(cli, name) is not None, name
    assert cli.commands.__name__ == "trl_reasoning.cli.commands"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr(cli, "nothing")  # noqa: B009
