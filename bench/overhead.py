"""Per-step overhead of every trl-reasoning trainer against its TRL counterpart, with a confidence interval on the
ratio: ``GRPOTrainer`` with the closest ``loss_type`` for every preset, and TRL's own ``RLOOTrainer`` for RLOO.

Time: both sides are built in this one process on the same model, batch (a deterministic ``rollout_func``; HF
``generate`` from the same seed against ``RLOOTrainer``, which has none), seed and settings, and trained in many short
blocks interleaved A B, B A, A B, ... so that a drift of the machine hits both alike. Each block is a fresh trainer
training ``--block-steps`` + 1 steps; its first step is dropped (warm-up). Per block and side: the mean wall time and
the mean process CPU time (``time.process_time``, all threads) of a step. The ratio ours / TRL is the geometric mean
of the per-block-pair ratios, with a 95% bootstrap interval over the pairs (10,000 resamples). Memory: the peak
resident memory during ``train()`` of one fresh process per side (``--memory``). Dynamic sampling is off for DAPO and
CISPO here: it does more work on purpose (see ``bench/dynamic_sampling.py``), and so is their overlong shaping, which
TRL lacks. Usage:

    python bench/overhead.py [--blocks 12] [--block-steps 3] [--memory] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import measure_train, run_worker, workload_trainer  # noqa: E402
from _results import record  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

ALIKE = {"dynamic_sampling": False, "overlong_cache_length": None}
# row -> (our trainer, our overrides, TRL trainer, TRL overrides, rollout_func on both sides?)
PAIRS = {
    "DAPO": ("DAPO", ALIKE, "GRPO", {"loss_type": "dapo", "epsilon_high": 0.28}, True),
    "CISPO": (
        "CISPO",
        {**ALIKE, "cast_lm_head_to_fp32": False},
        "GRPO",
        {"loss_type": "cispo", "epsilon_high": 5.0},
        True,
    ),
    "DPPO": ("DPPO", {}, "GRPO", {"loss_type": "grpo"}, True),
    "MaxRL": ("MaxRL", {"maxrl_reward_threshold": 3.0}, "GRPO", {"loss_type": "dapo"}, True),
    "RLOO vs GRPOTrainer": ("RLOO", {}, "GRPO", {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.05}, True),
    "RLOO vs RLOOTrainer": ("RLOO", {}, "RLOO", {"beta": 0.05}, False),
    "DrGRPO": ("DrGRPO", {}, "GRPO", {"loss_type": "dr_grpo", "scale_rewards": "none"}, True),
    "ScaleRL": (
        "ScaleRL",
        {},
        "GRPO",
        {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch", "cast_lm_head_to_fp32": True},
        True,
    ),
}
#: The overhead goals: every preset within 3% of its TRL counterpart, RLOO no slower than TRL's RLOOTrainer.
GOAL = {"RLOO vs RLOOTrainer": 1.0}
DEFAULT_GOAL = 1.03


def trainer_for(row: str, side: str, steps: int, vocab: int, length: int):
    """The trainer of one side (``"ours"`` or ``"trl"``) of ``row``, built on the shared workload."""
    import trl

    import trl_reasoning as tr

    ours, our_overrides, theirs, their_overrides, rollout = PAIRS[row]
    if side == "ours":
        classes, overrides = (getattr(tr, f"{ours}Config"), getattr(tr, f"{ours}Trainer")), our_overrides
    else:
        classes, overrides = (getattr(trl, f"{theirs}Config"), getattr(trl, f"{theirs}Trainer")), their_overrides
    return workload_trainer(*classes, overrides, steps, vocab, length, rollout=rollout)


class StepClock(TrainerCallback):
    """Records each optimizer step's wall time and process CPU time."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)


def time_block(row: str, side: str, block_steps: int, vocab: int, length: int) -> tuple[float, float]:
    """Mean wall and CPU seconds per step of a fresh trainer over ``block_steps`` steps (after one warm-up step)."""
    trainer = trainer_for(row, side, block_steps + 1, vocab, length)
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    return statistics.fmean(clock.wall[1:]), statistics.fmean(clock.cpu[1:])


def ratio_interval(ours: list[float], theirs: list[float], resamples: int = 10_000) -> tuple[float, float, float]:
    """Geometric mean of the paired ratios ``ours[i] / theirs[i]`` and its 95% percentile-bootstrap interval."""
    logs = [math.log(a / b) for a, b in zip(ours, theirs, strict=True)]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high)


def memory_worker(row: str, side: str, steps: int, vocab: int, length: int) -> dict:
    return measure_train(trainer_for(row, side, steps, vocab, length))


def verdict(row: str, ratio: tuple[float, float, float]) -> str:
    goal = GOAL.get(row, DEFAULT_GOAL)
    if ratio[2] <= goal:
        return f"≤ {goal:.2f} (interval below)"
    if ratio[1] > goal:
        return f"> {goal:.2f} (interval above)"
    return f"undecided at {goal:.2f}"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="A/B block pairs per row")
    parser.add_argument("--block-steps", type=int, default=3, help="measured steps per block (after a warm-up)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--length", type=int, default=64, help="completion length in tokens")
    parser.add_argument("--rows", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--memory", action="store_true", help="also peak memory, one fresh process per side")
    parser.add_argument("--quick", action="store_true", help="2 blocks of 1 step, small model, DAPO: checks it runs")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "SIDE"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.blocks, options.block_steps, options.vocab, options.length = 2, 1, 512, 16
        if options.rows == list(PAIRS):
            options.rows = ["DAPO"]
    if options.worker_out:
        result = memory_worker(*options.worker, options.block_steps + 1, options.vocab, options.length)
        with open(options.worker_out, "w") as f:
            json.dump(result, f)
        return ""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from _common import cpu_threads

    cpu_threads()
    lines = [
        f"Overhead vs TRL: Qwen2 2x128, vocab {options.vocab}, 8 completions x {options.length} tokens per step; "
        f"{options.blocks} interleaved A/B block pairs of {options.block_steps} measured steps per row, one process, "
        "CPU. Ratio ours / TRL: geometric mean over block pairs [95% bootstrap interval]; step times are medians of "
        "the block means.",
        "",
        "| trainer | TRL counterpart | wall s/step ours | wall s/step TRL | wall ratio [95% CI] | CPU ratio [95% CI] "
        "| verdict (wall) |" + (" peak MiB ours | peak MiB TRL |" if options.memory else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if options.memory else ""),
    ]
    for row in options.rows:
        blocks = {"ours": [], "trl": []}
        for index in range(options.blocks):
            for side in ("ours", "trl") if index % 2 == 0 else ("trl", "ours"):
                blocks[side].append(time_block(row, side, options.block_steps, options.vocab, options.length))
        wall = ratio_interval([b[0] for b in blocks["ours"]], [b[0] for b in blocks["trl"]])
        cpu = ratio_interval([b[1] for b in blocks["ours"]], [b[1] for b in blocks["trl"]])
        _, _, theirs, their_overrides, _ = PAIRS[row]
        counterpart = f"{theirs}Trainer " + ", ".join(f"{k}={v}" for k, v in their_overrides.items())
        line = (
            f"| {row.split(' vs ')[0]} | {counterpart} | {statistics.median(b[0] for b in blocks['ours']):.4f} | "
            f"{statistics.median(b[0] for b in blocks['trl']):.4f} | {wall[0]:.3f} [{wall[1]:.3f}, {wall[2]:.3f}] | "
            f"{cpu[0]:.3f} [{cpu[1]:.3f}, {cpu[2]:.3f}] | {verdict(row, wall)} |"
        )
        if options.memory:
            peaks = {
                side: run_worker(
                    os.path.abspath(__file__),
                    ["--worker", row, side, "--block-steps", str(options.block_steps), "--vocab", str(options.vocab)]
                    + ["--length", str(options.length)],
                    in_process=main if options.quick else None,
                )["peak_mib"]
                for side in ("ours", "trl")
            }
            line += f" {peaks['ours']:.0f} | {peaks['trl']:.0f} |"
        lines.append(line)
        print(line, flush=True)
    lines += [
        "",
        "RLOO puts `beta` in the reward with `log pi_old - log pi_ref`, so it makes one no-grad forward for `log pi_old` "
        "that an on-policy GRPOTrainer skips; TRL's own RLOOTrainer makes the same forward (and generates with HF "
        "`generate` on both sides of its row: it takes no `rollout_func`).",
    ]
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("Overhead against TRL (v2: interleaved blocks, intervals)", table)
    return table


if __name__ == "__main__":
    main()
