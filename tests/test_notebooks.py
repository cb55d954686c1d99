"""The notebooks in examples/ run top to bottom in a real Jupyter kernel (nbclient), as a user runs them.

CI sets ``TRL_REASONING_NOTEBOOK_QUICK=1`` (few steps, small evaluation) and ``HF_HUB_OFFLINE=1``: the GPU notebook's
cells then report what they need and skip themselves, and the push_to_hub cells report that they skip."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))

pytestmark = pytest.mark.slow


def _code(notebook) -> list[str]:
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def _outputs_text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", "") or json.dumps(output.get("data", {})))
    return "\n".join(parts)


def test_the_examples_are_the_four_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "compare-algorithms.ipynb",
        "gsm8k-lora.ipynb",
        "quickstart.ipynb",
        "real-model.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_have_no_outputs_and_use_only_the_public_api(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs are not stripped"
    source = "\n".join(_code(notebook))
    # no private module or attribute of trl-reasoning (or of a trainer) is used
    assert not re.search(r"trl_reasoning\._|\btr\._|from \._|\.\b_[a-z]\w*", source), path.name


def test_the_quickstart_swap_is_one_line():
    cells = _code(nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4))
    trl_cell = next(c for c in cells if c.startswith("from trl import GRPOConfig, GRPOTrainer"))
    dapo_cell = next(c for c in cells if c.startswith("from trl_reasoning import DAPOConfig"))
    changed = [
        line
        for line in difflib.unified_diff(trl_cell.splitlines(), dapo_cell.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "-from trl import GRPOConfig, GRPOTrainer",
        "+from trl_reasoning import DAPOConfig as GRPOConfig, DAPOTrainer as GRPOTrainer",
    ]


def _execute(name: str, tmp_path: Path, monkeypatch, cache: Path | None = None) -> object:
    monkeypatch.setenv("TRL_REASONING_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_REASONING_CACHE", str(cache or tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    return notebook


def test_quickstart_runs_top_to_bottom(tmp_path, monkeypatch):
    notebook = _execute("quickstart", tmp_path, monkeypatch)
    text = _outputs_text(notebook)
    assert "push_to_hub skipped" in text
    assert "DAPOTrainer" in text and "GRPOTrainer" in text  # the pass@k table has both runs
    assert (tmp_path / "outputs" / "quickstart" / "DAPOTrainer" / "README.md").is_file()  # the model card
    assert "dapo" in (tmp_path / "outputs" / "quickstart" / "DAPOTrainer" / "README.md").read_text().lower()


def test_compare_algorithms_runs_top_to_bottom(tmp_path, monkeypatch):
    text = _outputs_text(_execute("compare-algorithms", tmp_path, monkeypatch))
    for name in ("TRL GRPO", "DAPO", "Dr. GRPO", "MaxRL"):
        assert f"{name}: 2 steps" in text


def test_gsm8k_lora_skips_its_gpu_and_hub_cells_cleanly(tmp_path, monkeypatch):
    text = _outputs_text(_execute("gsm8k-lora", tmp_path, monkeypatch))
    assert "preset dapo: DAPOConfig / DAPOTrainer" in text
    assert "This notebook needs a CUDA GPU and the Hugging Face Hub" in text or "needs the Hugging Face Hub" in text
    assert text.count("skipped:") >= 4


def test_real_model_trains_smollm2_on_a_cpu(tmp_path, tmp_path_factory, monkeypatch):
    from journeys.test_real_model import shared_real_model_cache

    notebook = _execute("real-model", tmp_path, monkeypatch, cache=shared_real_model_cache(tmp_path_factory))
    text = _outputs_text(notebook)
    assert "134.5M parameters" in text and "DAPO: 2 steps" in text
    assert "SmolLM2-135M-Instruct" in text and "after DAPO" in text
    assert (tmp_path / "outputs" / "real-model" / "dapo" / "adapter_model.safetensors").is_file()
