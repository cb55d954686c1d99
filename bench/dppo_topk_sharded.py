"""DPPO top-K under sharding: peak training memory of the LM-head path vs the ``[B, T, vocab]`` logits fallback, with
two gloo processes under DDP, DeepSpeed ZeRO-3 and FSDP2.

Before this package ran the chunked LM head inside the model's forward, a sharded head (ZeRO-3 partitions, FSDP2)
sent DPPO's top-K divergence to the logits fallback; ``logits`` below forces that path, ``LM head`` is what runs now.
The workload is ``_common.workload_trainer``'s (32k-token vocabulary, deterministic rollout, 8 completions per
process and step). Each configuration runs in its own ``torchrun``; memory is the peak resident set size during
``train()`` above the level just before it, the larger of the two ranks. Usage:

    python bench/dppo_topk_sharded.py [--steps 2] [--repeats 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_torchrun  # noqa: E402  (and tests/ on sys.path, where _sharding lives)
from _results import record  # noqa: E402

STRATEGIES = ("ddp", "zero3", "fsdp2")
PATHS = ("logits", "LM head")


def worker(strategy: str, paths: list[str], steps: int, vocab: int, length: int, out: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from _common import measure_train, workload_trainer
    from _sharding import reset_strategy_state, strategy_kwargs
    from accelerate.utils import gather_object

    import trl_reasoning as tr

    results, environment = {}, dict(os.environ)
    for path in paths:
        reset_strategy_state(environment)
        overrides = {**strategy_kwargs(strategy), "dppo_divergence": "topk_tv"}
        trainer = workload_trainer(tr.DPPOConfig, tr.DPPOTrainer, overrides, steps, vocab, length)
        # False: the logits fallback, the path sharding used to take
        trainer.topk_forward.lm_head_from_hidden = path == "LM head"
        peaks = gather_object([measure_train(trainer)["peak_mib"]])
        results[path] = {"peak_mib": max(peaks), "kept_lm_head": trainer.topk_forward.lm_head_from_hidden}
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(results, f)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # destroys the gloo group: one left alive can abort a rank at exit (SIGABRT)


def _torchrun(arguments: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        result = run_torchrun(os.path.abspath(__file__), ["--worker-out", out, *arguments])
        if result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(__file__)} {' '.join(arguments)} failed:\n{result.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--length", type=int, default=128, help="completion length in tokens")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="ZeRO-3 only, 1 step, small vocab, both paths in one launch: checks the script runs",
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.steps, options.repeats, options.vocab, options.length = 1, 1, 512, 16
    if options.worker_out:
        worker(
            options.strategy,
            options.paths.split(","),
            options.steps,
            options.vocab,
            options.length,
            options.worker_out,
        )
        return ""

    strategies = ("zero3",) if options.quick else STRATEGIES
    # A launch per configuration keeps the memory accounting clean; quick mode runs both paths in one launch.
    launches = [list(PATHS)] if options.quick else [[path] for path in PATHS]
    peaks: dict[tuple[str, str], list[float]] = {(s, p): [] for s in strategies for p in PATHS}
    for _ in range(options.repeats):
        for strategy in strategies:
            for paths in launches:  # interleaved
                data = _torchrun(
                    ["--strategy", strategy, "--paths", ",".join(paths), "--steps", str(options.steps)]
                    + ["--vocab", str(options.vocab), "--length", str(options.length)]
                )
                for path, result in data.items():
                    if result["kept_lm_head"] != (path == "LM head"):
                        raise RuntimeError(f"{strategy}: the {path!r} path did not hold for the whole run")
                    peaks[(strategy, path)].append(result["peak_mib"])
    lines = [
        f"DPPO top-K (topk_tv, K=20) under sharding: 2 gloo processes, vocab {options.vocab}, 8 completions x "
        f"{options.length} tokens per process and step, {options.steps} steps x {options.repeats} repeats, CPU "
        "(medians; peak RSS in train() above the level before it, the larger rank)",
        "",
        "| strategy | logits fallback (MiB) | LM head path (MiB) | ratio |",
        "|---|---|---|---|",
    ]
    for strategy in strategies:
        before = statistics.median(peaks[(strategy, "logits")])
        after = statistics.median(peaks[(strategy, "LM head")])
        lines.append(f"| {strategy} | {before:.0f} | {after:.0f} | {after / before:.2f} |")
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("DPPO top-K under sharding", table)
    return table


if __name__ == "__main__":
    main()
