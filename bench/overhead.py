"""Per-step overhead of every trl-reasoning trainer against TRL's own ``GRPOTrainer`` with the closest ``loss_type``.

Same model, batch (deterministic ``rollout_func``), seed and settings on both sides; each (trainer, side) runs in a
fresh subprocess, interleaved A/B and B/A over the repeats, so slow drifts of the machine hit both sides alike.
Reported: median step time (TRL's ``step_time`` metric, first step dropped) and peak resident memory during
``train()``, with their ratios (ours / TRL). Dynamic sampling is off for DAPO here: it does more work on purpose
(see ``bench/dynamic_sampling.py``), and so is its overlong shaping, which TRL lacks. Usage:

    python bench/overhead.py [--steps 8] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_worker, train_on_workload  # noqa: E402
from _results import record  # noqa: E402

# trainer -> (our overrides, the closest TRL GRPOConfig settings). Both sides share the common settings below.
PAIRS = {
    "DAPO": ({"dynamic_sampling": False, "overlong_cache_length": None}, {"loss_type": "dapo", "epsilon_high": 0.28}),
    "CISPO": ({}, {"loss_type": "cispo", "epsilon_high": 5.0}),
    "DPPO": ({}, {"loss_type": "grpo"}),
    "MaxRL": ({"maxrl_reward_threshold": 3.0}, {"loss_type": "dapo"}),
    "RLOO": ({}, {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.05}),
    "DrGRPO": ({}, {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    "ScaleRL": (
        {},
        {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch", "cast_lm_head_to_fp32": True},
    ),
}


def worker(trainer_name: str, side: str, steps: int, vocab: int, length: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    import trl_reasoning as tr

    ours, theirs = PAIRS[trainer_name]
    if side == "trl":
        return train_on_workload(GRPOConfig, GRPOTrainer, theirs, steps, vocab, length)
    config_class = getattr(tr, f"{trainer_name}Config")
    trainer_class = getattr(tr, f"{trainer_name}Trainer")
    return train_on_workload(config_class, trainer_class, ours, steps, vocab, length)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--length", type=int, default=64, help="completion length in tokens")
    parser.add_argument("--trainers", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 steps, small model, DAPO unless --trainers, workers in this process: checks the script runs",
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("TRAINER", "SIDE"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.steps, options.repeats, options.vocab, options.length = 3, 1, 512, 16
        if options.trainers == list(PAIRS):
            options.trainers = ["DAPO"]
    if options.worker_out:
        result = worker(*options.worker, options.steps, options.vocab, options.length)
        with open(options.worker_out, "w") as f:
            json.dump(result, f)
        return ""

    results = {(name, side): {"peak": [], "time": []} for name in options.trainers for side in ("trl", "ours")}
    for repeat in range(options.repeats):
        for name in options.trainers:
            sides = ("trl", "ours") if repeat % 2 == 0 else ("ours", "trl")
            for side in sides:
                data = run_worker(
                    os.path.abspath(__file__),
                    ["--worker", name, side, "--steps", str(options.steps), "--vocab", str(options.vocab)]
                    + ["--length", str(options.length)],
                    in_process=main if options.quick else None,
                )
                results[name, side]["peak"].append(data["peak_mib"])
                results[name, side]["time"].extend(data["step_times"])

    lines = [
        f"Overhead vs trl.GRPOTrainer: Qwen2 2x128, vocab {options.vocab}, 8 completions x {options.length} tokens per "
        f"step, {options.steps} steps x {options.repeats} interleaved repeats, CPU. Medians (step time without the "
        "first step); spread = min-max over all measured steps.",
        "",
        "| trainer | TRL counterpart | step time ours (s) | step time TRL (s) | time ratio | spread ours | spread TRL "
        "| peak MiB ours | peak MiB TRL | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in options.trainers:
        ours, trl = results[name, "ours"], results[name, "trl"]
        t_ours, t_trl = statistics.median(ours["time"]), statistics.median(trl["time"])
        m_ours, m_trl = statistics.median(ours["peak"]), statistics.median(trl["peak"])
        counterpart = ", ".join(f"{k}={v}" for k, v in PAIRS[name][1].items())
        lines.append(
            f"| {name} | {counterpart} | {t_ours:.4f} | {t_trl:.4f} | {t_ours / t_trl:.3f} | "
            f"{min(ours['time']):.4f}-{max(ours['time']):.4f} | {min(trl['time']):.4f}-{max(trl['time']):.4f} | "
            f"{m_ours:.0f} | {m_trl:.0f} | {m_ours / m_trl:.2f} |"
        )
    if "RLOO" in options.trainers:
        lines += [
            "",
            "RLOO puts `beta` in the reward with `log pi_old - log pi_ref`, so it makes one no-grad forward for "
            "`log pi_old` that an on-policy GRPOTrainer skips; TRL's own RLOOTrainer makes the same forward.",
        ]
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("Overhead against trl.GRPOTrainer", table)
    return table


if __name__ == "__main__":
    main()
