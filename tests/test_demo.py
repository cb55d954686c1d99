"""The README's main job, in a fast mode: the demo trains and saves a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_reasoning.demo.__main__ import main


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dapo", "maxrl"])
def test_demo_runs_end_to_end(algorithm, tmp_path, capsys):
    result = main(["--algorithm", algorithm, "--steps", "5", "--output-dir", str(tmp_path)])
    assert 0.0 <= result["first_reward"] <= 1.0 and 0.0 <= result["last_reward"] <= 1.0
    assert (Path(result["output_dir"]) / "config.json").exists()
    assert "| step | reward |" in capsys.readouterr().out
