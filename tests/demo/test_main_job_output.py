"""The main job (``python -m trl_reasoning.demo``, README's first command) prints its own lines and nothing else.

It printed, around its own lines, bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community",
DeepSpeed's "Setting accelerator to CPU", transformers' ``is_gradient_checkpointing`` FutureWarning (raised when TRL
unwraps the model) and its own DynamicSamplingWarning located at ``<frozen runpy>:88``. The job runs here in a
subprocess, as a user runs it, and every line of its output (stdout and stderr) must be one of the demo's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).parents[2]
NUMBER = r"[-+]?\d+(?:\.\d+)?"
PERCENT = rf"{NUMBER}%"
#: Every line the tiny main job may print: its progress, its summary table, and the warnings of this package, which
#: name the demo's own line (the DynamicSamplingWarning of a smoke run that learns nothing, with its source line).
EXPECTED_LINES = [
    r"torch threads: \d+ \(--num_threads (auto|\d+)\)",
    rf"warm start: \d+ SFT steps, final training loss {NUMBER}",
    r"warm start: (trained|cached) in \d+ s \(.+\)",
    rf"before: held-out accuracy {NUMBER}, pass@1 {NUMBER} \(\d+ s\)",
    rf"step +\d+: held-out accuracy {NUMBER}, pass@1 {NUMBER}",
    rf"step +\d+: reward {NUMBER}, completion length {NUMBER}, step time {NUMBER} s",
    r"",
    r"DAPO on digit reversal: \d+ held-out problems, \d+ samples each, \d+ RL steps",
    r"\| model \| held-out accuracy \(greedy\) \| pass@1 \| pass@\d+ \| mean completion length \(tokens\) \|",
    r"\|---\|---:\|---:\|---:\|---:\|",
    rf"\| (warm start \(SFT\)|after DAPO) \| {PERCENT} \| {PERCENT} \| {PERCENT} \| {NUMBER} \|",
    rf"held-out accuracy {NUMBER} points, pass@1 {NUMBER} points \(each pass@1 within ±{NUMBER} points from "
    rf"sampling alone; the evaluation is seeded\); wall time \d+ s \(model \d+ s, evaluation \d+ s, RL \d+ s\)",
    r"model and model card: .+(; curves: .+\.png| \(install matplotlib for the PNG\))",
    # the message alone, as the job's other lines (no source path, no `trainer.train()` line)
    r"DynamicSamplingWarning: Dynamic sampling found \d+ informative groups .*",
]


def _unexpected(lines: list[str]) -> list[str]:
    return [line for line in lines if not any(re.fullmatch(pattern, line) for pattern in EXPECTED_LINES)]


def test_the_expected_lines_tell_the_noise_from_the_demo():
    """The patterns reject what the main job used to print (this test would pass vacuously otherwise)."""
    noise = [
        "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure "
        "you already `pip install kernels` and the kernels >= 0.11.1",
        "[2026-01-01 00:00:00,000] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. If "
        "you have GPU or other accelerator, we were unable to detect it.",
        "/x/transformers/modeling_utils.py:3312: FutureWarning: `is_gradient_checkpointing` is deprecated and will be "
        "removed in v6. Use `is_activation_checkpointing` instead.",
        "  warnings.warn(",
        "<frozen runpy>:88: DynamicSamplingWarning: Dynamic sampling found 0 informative groups (rewards not all "
        "equal) in max_num_gen_batches=2 generation rounds.",
        "/x/trl_reasoning/demo/run.py:465: DynamicSamplingWarning: Dynamic sampling found 0 informative groups (rewards "
        "not all equal) in max_num_gen_batches=2 generation rounds.",
        "  trainer.train()",
    ]
    assert _unexpected(noise) == noise
    assert _unexpected(["torch threads: 1 (--num_threads auto)", "| after DAPO | 0.0% | 0.0% | 0.0% | 4.69 |"]) == []


@pytest.mark.slow
def test_the_main_job_prints_only_its_own_lines(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "trl_reasoning.demo", "--model", "tiny", "--fast", "--num_train", "128"]
    command += ["--warm_start_steps", "10", "--cache_dir", str(tmp_path / "cache")]
    command += ["--output_dir", str(tmp_path / "out"), "--num_threads", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    lines = output.splitlines()
    assert any(line.startswith("| after DAPO |") for line in lines), output[-5000:]
    assert _unexpected(lines) == [], output[-5000:]


@pytest.mark.parametrize(
    "argv,usage", [(["demo", "--help"], "usage: trl-reasoning demo"), (["--help"], "usage: trl-reasoning <command>")]
)
def test_the_console_script_is_as_quiet_as_python_m(argv, usage):
    """``trl-reasoning demo`` is the main job too, and every other command is quieted the same way: the installed
    console script drops bitsandbytes' import-time notice before ``trl_reasoning.cli`` imports TRL (``trl-reasoning
    --help`` used to open with it). The entry point is read from the installed metadata, as the launcher reads it."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "trl-reasoning"]
    code = f"import sys; sys.argv = ['trl-reasoning', *{argv!r}]; from {script.module} import {script.attr} as m; m()"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(usage), result.stdout[:500]
    assert "gemm_4bit_forward" not in result.stdout + result.stderr, result.stderr[-3000:]


def test_the_main_job_prints_a_warning_as_its_message_alone():
    """A warning the main job raises (``DynamicSamplingWarning``) reads as its other lines: no source path, no
    ``trainer.train()`` line."""
    import warnings

    from trl_reasoning import DynamicSamplingWarning
    from trl_reasoning.demo.quiet import message_only

    text = message_only(DynamicSamplingWarning("ran out of rounds"), DynamicSamplingWarning, "/x/run.py", 12, "t()")
    assert text == "DynamicSamplingWarning: ran out of rounds\n"
    assert warnings.formatwarning is not message_only  # a user's process keeps Python's format


def test_the_main_job_hides_the_gguf_conversion_progress_bar():
    """The first run of the main job converts the real model, and transformers' GGUF loader draws a ``tqdm`` bar
    ("Converting and de-quantizing GGUF tensors...") that the tiny job above never meets: the main job's quieting
    turns tqdm off before it is imported (``TQDM_DISABLE``, unless the user set it)."""
    bar = "from tqdm.auto import tqdm; [None for _ in tqdm(range(3), desc='Converting and de-quantizing GGUF tensors...')]"
    quieted = f"from trl_reasoning.demo.quiet import quiet_library_noise; quiet_library_noise(); {bar}"
    env = {key: value for key, value in os.environ.items() if key != "TQDM_DISABLE"}
    quiet = subprocess.run([sys.executable, "-c", quieted], capture_output=True, text=True, timeout=120, env=env)
    assert quiet.returncode == 0 and quiet.stdout + quiet.stderr == "", quiet.stderr
    plain = subprocess.run([sys.executable, "-c", bar], capture_output=True, text=True, timeout=120, env=env)
    assert "Converting and de-quantizing" in plain.stderr  # what a script of the user's own still shows
