"""The quick mode of every bench script runs, so the scripts cannot rot (their numbers are not asserted)."""

from __future__ import annotations

import math
import random
import threading

import pytest
from conftest import load_bench_script as _load
from transformers import TrainerCallback

pytestmark = pytest.mark.slow


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


class _StepOrder(TrainerCallback):
    """Appends ``(side, step)`` to a shared list at each optimizer step's end; raises at step ``fail_at``."""

    def __init__(self, side: str, order: list, fail_at: int | None = None) -> None:
        self.side, self.order, self.fail_at = side, order, fail_at

    def on_step_end(self, args, state, control, **kwargs):
        self.order.append((self.side, state.global_step))
        if state.global_step == self.fail_at:
            raise RuntimeError(f"{self.side} fails at step {state.global_step}")


def _session_in_thread(overhead, build, first: str) -> dict:
    """``interleaved_session`` in a daemon thread: a deadlock fails the test after 300 s instead of hanging CI."""
    outcome: dict = {}

    def run():
        try:
            outcome["clocks"] = overhead.interleaved_session(build, first=first)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "interleaved_session did not finish: the two sides wait on each other"
    return outcome


def test_overhead_sides_train_in_strict_turns():
    overhead = _load("overhead")
    order: list = []

    def build(side):
        trainer = overhead.trainer_for("DAPO", side, 3, 512, 16)
        trainer.add_callback(_StepOrder(side, order))
        return trainer

    outcome = _session_in_thread(overhead, build, first="trl")
    assert order == [("trl", 1), ("ours", 1), ("trl", 2), ("ours", 2), ("trl", 3), ("ours", 3)]
    for clock in outcome["clocks"].values():
        assert len(clock.wall) == len(clock.cpu) == 3 and all(t > 0 for t in clock.wall)


def test_overhead_session_reports_a_failing_side_and_lets_the_other_finish():
    overhead = _load("overhead")
    order: list = []

    def build(side):
        trainer = overhead.trainer_for("DAPO", side, 3, 512, 16)
        trainer.add_callback(_StepOrder(side, order, fail_at=1 if side == "ours" else None))
        return trainer

    outcome = _session_in_thread(overhead, build, first="ours")
    assert isinstance(outcome["error"], RuntimeError) and "'ours' trainer failed" in str(outcome["error"])
    assert str(outcome["error"].__cause__) == "ours fails at step 1"
    assert order == [("ours", 1), ("trl", 1), ("trl", 2), ("trl", 3)]


def test_overhead_ratio_interval():
    overhead = _load("overhead")
    exact = overhead.ratio_interval([[math.log(1.05)] * 8] * 3, resamples=500)
    assert exact == pytest.approx((1.05, 1.05, 1.05))
    rng = random.Random(1)
    noisy = [[math.log(1.02) + rng.gauss(0, 0.02) for _ in range(40)] for _ in range(4)]
    point, low, high = overhead.ratio_interval(noisy, resamples=2000)
    assert low < point < high and low < 1.02 < high and high - low < 0.03
    spread = [[value + shift for value in session] for session, shift in zip(noisy, (-0.05, 0.05, -0.05, 0.05))]
    _, spread_low, spread_high = overhead.ratio_interval(spread, resamples=2000)
    assert spread_high - spread_low > high - low, "a difference between sessions must widen the interval"


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
    """bench/gpu.py runs on a CPU in smoke mode (its code, not a result), and without --smoke it needs CUDA."""
    gpu = _load("gpu")
    table = gpu.main(["--smoke"])
    assert "| DAPO | GRPOTrainer loss_type=dapo" in table and "| DPPO topk_tv |" in table
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA device; --smoke runs the same code on a CPU"):
            gpu.main([])


def test_async_throughput_bench_worker_runs_both_generators():
    bench = _load("async_throughput")
    for arm, preset in (("sync-1t", "DAPO"), ("process-k1", "CISPO")):
        run = bench.worker("tiny", arm, seed=0, steps=2, warmup=1, preset=preset)
        assert run["arm"] == arm and run["tokens_per_second"] > 0 and math.isfinite(run["reward_last5"])
        assert run["preset"] == preset and 0 < run["in_trainer_generation_seconds"] < run["seconds_per_step"]
    assert run["generation_seconds"] is not None and run["wait_seconds"] is not None
    assert bench.arm_settings("process-k8") == (
        1,
        {"async_rollouts": True, "max_staleness": 8, "async_generator": "process"},
    )
    assert bench.arm_settings("process2t-k2")[0] == 2


def test_async_memory_bench_quick():
    table = _load("async_memory").main(["--quick"])
    assert "full fine-tune" in table and "LoRA r=8" in table
