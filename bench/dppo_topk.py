"""DPPO top-K divergence vs binary divergence vs plain DAPO: peak training memory and step time, in one run.

The model is a small randomly initialised Qwen2 with a 32k-token vocabulary, so that the ``[batch, T, vocab]``
logits dominate memory as they do in real LLMs; completions come from a deterministic ``rollout_func`` so that every
configuration trains on exactly the same batch. Each configuration runs in its own subprocess (repeated and
interleaved); memory is the peak resident set size during ``train()`` above the level just before it, step time is
TRL's ``step_time`` metric. Prints a markdown table with medians and the ratios to ``binary_tv``. Usage:

    python bench/dppo_topk.py [--steps 6] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_worker, train_on_workload, trainer_classes  # noqa: E402
from _results import record  # noqa: E402

CONFIGS = {
    "DPPO topk_tv": ("DPPO", {"dppo_divergence": "topk_tv"}),
    "DPPO binary_tv": ("DPPO", {"dppo_divergence": "binary_tv"}),
    "DAPO": ("DAPO", {"dynamic_sampling": False}),
}


def worker(name: str, steps: int, vocab: int, length: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer_name, overrides = CONFIGS[name]
    return train_on_workload(*trainer_classes(trainer_name), overrides, steps, vocab, length)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--length", type=int, default=128, help="completion length in tokens")
    parser.add_argument(
        "--quick", action="store_true", help="2 steps, small vocab, workers in this process: checks the script runs"
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.steps, options.repeats, options.vocab, options.length = 2, 1, 512, 16
    if options.worker_out:
        import json

        with open(options.worker_out, "w") as f:
            json.dump(worker(options.config, options.steps, options.vocab, options.length), f)
        return ""

    results: dict[str, dict[str, list[float]]] = {name: {"peak": [], "time": []} for name in CONFIGS}
    for _ in range(options.repeats):
        for name in CONFIGS:  # interleaved: A B C A B C
            data = run_worker(
                os.path.abspath(__file__),
                ["--config", name, "--steps", str(options.steps), "--vocab", str(options.vocab)]
                + ["--length", str(options.length)],
                in_process=main if options.quick else None,
            )
            results[name]["peak"].append(data["peak_mib"])
            results[name]["time"].extend(data["step_times"])

    base = results["DPPO binary_tv"]
    base_peak, base_time = statistics.median(base["peak"]), statistics.median(base["time"])
    lines = [
        f"DPPO top-K vs binary vs DAPO: vocab {options.vocab}, 8 completions x {options.length} tokens per step, "
        f"{options.steps} steps x {options.repeats} interleaved repeats, CPU (medians; step time without the first "
        "step)",
        "",
        "| configuration | peak memory in train() (MiB) | ratio to binary_tv | step time (s) | min-max | ratio to "
        "binary_tv |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        peak, time = statistics.median(r["peak"]), statistics.median(r["time"])
        lines.append(
            f"| {name} | {peak:.0f} | {peak / base_peak:.2f} | {time:.3f} | {min(r['time']):.3f}-{max(r['time']):.3f} "
            f"| {time / base_time:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("DPPO top-K vs binary vs DAPO", table)
    return table


if __name__ == "__main__":
    main()
