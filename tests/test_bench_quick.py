"""The quick mode of every bench script runs, so the scripts cannot rot (their numbers are not asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"

pytestmark = pytest.mark.slow


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dynamic_sampling_bench_quick():
    table = _load("dynamic_sampling").main(["--quick"])
    assert "| off |" in table and "| on, full rounds (verl) |" in table and "| on, keep-rate rounds |" in table


def test_dppo_topk_bench_quick():
    table = _load("dppo_topk").main(["--quick"])
    assert "| DPPO topk_tv |" in table and "| DAPO |" in table


def test_dppo_topk_sharded_bench_quick():
    pytest.importorskip("deepspeed")
    table = _load("dppo_topk_sharded").main(["--quick"])
    assert "| zero3 |" in table


def test_overhead_bench_quick():
    table = _load("overhead").main(["--quick"])
    assert "| DAPO | GRPOTrainer loss_type=dapo" in table


def test_miniature_bench_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_REASONING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # run outputs go under ./outputs
    text = _load("miniature").main(["--quick"])
    assert "| TRL GRPO |" in text and "| ScaleRL |" in text and "| claim | reproduces here? |" in text


def test_testbed_bench_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_REASONING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    text = _load("testbed").main(["--quick"])
    for method in ("TRL GRPO", "TRL GRPO (loss_type=grpo)", "TRL RLOOTrainer", "DAPO", "CISPO", "DPPO", "MaxRL"):
        assert f"| {method} |" in text
    assert "| RLOO preset = TRL's RLOOTrainer" in text and "**stale**" in text


def test_math_reward_bench_quick():
    pytest.importorskip("math_verify")
    table = _load("math_reward").main(["--quick"])
    assert "| trl-reasoning (fast path + math-verify) | 32/32 |" in table


def test_gpu_bench_smoke_and_its_cuda_requirement():
    """bench/gpu.py has not run on a GPU here; its code runs on a CPU in smoke mode, and without --smoke it needs
    CUDA."""
    gpu = _load("gpu")
    table = gpu.main(["--smoke"])
    assert "| DAPO | GRPOTrainer loss_type=dapo" in table and "| DPPO topk_tv |" in table
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA device; --smoke runs the same code on a CPU"):
            gpu.main([])
