"""The off-policy claim in its natural setting: clip vs CISPO vs DPPO with asynchronous rollouts at k = 8.

ScaleRL trains CISPO with PipelineRL-8 and DPPO's authors argue their trust region for stale rollouts; this runs the
chain-sum testbed (``bench/testbed.py``: same task, warm start, token budget and held-out evaluation) with
``async_rollouts=True, max_staleness=8``, each sample used once (``num_iterations=1``), in three arms that differ
**only in the policy loss** (estimator ``grpo``, aggregation ``token_mean``, no dynamic sampling in all three):

- ``clip``: PPO clip with clip-higher (0.2 / 0.28), TRL's importance-sampling correction between π_old and μ;
- ``cispo``: CISPO, weight ``min(π/μ, 5)`` against the sampler (ScaleRL's);
- ``dppo``: DPPO binary TV against the sampler.

Each difference to ``clip`` is paired by seed with a 95% Student-t interval. Runs are kept in
``bench/async_claim_runs.json`` (resumable); the table goes to ``bench/RESULTS.md``.

    python bench/async_claim.py [--seeds 0 1 2 3 4] [--budget 30000] [--k 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testbed  # noqa: E402
from _common import t_interval  # noqa: E402
from _results import read_runs, record, save_run  # noqa: E402

RUNS = Path(__file__).with_name("async_claim_runs.json")
_BASE = {"advantage_estimator": "grpo", "loss_aggregation": "token_mean", "dynamic_sampling": False}
ARMS = {
    "clip": {**_BASE, "policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.28},
    "cispo": {**_BASE, "policy_loss": "cispo", "epsilon_high": 5.0},
    "dppo": {**_BASE, "policy_loss": "dppo", "dppo_divergence": "binary_tv"},
}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=30_000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--summarize", action="store_true")
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    regime = f"async-k{options.k}"
    testbed.REGIMES[regime] = {"async_rollouts": True, "max_staleness": options.k, "num_iterations": 1}
    for arm, overrides in ARMS.items():
        testbed.METHODS[arm] = ("Reasoning", overrides)
    if not options.summarize:
        import torch

        from trl_reasoning.demo.warm_start import WarmStartSettings, warm_start
        from trl_reasoning.tasks.chain_sums import ChainSumTask

        torch.set_num_threads(1)
        task = ChainSumTask(num_test_per_length=20)
        model_dir, _ = warm_start(task, WarmStartSettings(max_steps=600))
        task_settings = {key: value for key, value in task.to_dict().items() if key != "kind"}
        for seed in options.seeds:
            for arm in ARMS:
                key = f"{regime}/{arm}/{seed}/{options.budget}"
                if key in read_runs(RUNS):
                    continue
                job = {
                    "method": arm,
                    "regime": regime,
                    "seed": seed,
                    "budget": options.budget,
                    "batch_size": 64,
                    "learning_rate": 1e-4,
                    "max_completion_length": 32,
                    "eval_every": 1_000_000,  # no curve: the final evaluation only
                    "curve_stride": 2,
                    "samples": testbed.MAX_K,
                    "model_dir": str(model_dir),
                    "task": task_settings,
                    "output_dir": "outputs/async-claim",
                }
                result = testbed.run_one(job)
                save_run(RUNS, key, result)
                print(f"{key}: pass@1 {result['pass_at_k'][0]:.3f} ({result['steps']} steps)", flush=True)
    return summarize(regime, options)


def summarize(regime: str, options) -> str:
    runs = read_runs(RUNS)
    by_arm = {
        arm: {
            r["seed"]: r
            for k, r in runs.items()
            if k.startswith(f"{regime}/{arm}/") and k.endswith(f"/{options.budget}")
        }
        for arm in ARMS
    }
    measures = {
        "pass@1": lambda r: r["pass_at_k"][0],
        "pass@16": lambda r: r["pass_at_k"][-1],
        "greedy accuracy": lambda r: r["greedy_accuracy"],
    }
    lines = [
        "| arm | seeds | steps (median) | " + " | ".join(measures) + " |",
        "|---|---:|---:|" + "---:|" * len(measures),
    ]
    for arm, seeds in by_arm.items():
        if not seeds:
            continue
        cells = [f"{statistics.fmean(f(r) for r in seeds.values()):.3f}" for f in measures.values()]
        steps = statistics.median(r["steps"] for r in seeds.values())
        lines.append(f"| {arm} | {len(seeds)} | {steps:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "| difference (paired by seed) | " + " | ".join(measures) + " |", "|---|" + "---|" * len(measures)]
    for arm in ("cispo", "dppo"):
        common = sorted(set(by_arm[arm]) & set(by_arm["clip"]))
        if len(common) < 2:
            continue
        cells = []
        for f in measures.values():
            mean, low, high = t_interval([f(by_arm[arm][s]) - f(by_arm["clip"][s]) for s in common])
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append(f"| {arm} − clip ({len(common)} seeds) | " + " | ".join(cells) + " |")
    table = (
        f"Chain-sum testbed (`bench/testbed.py`'s task, warm start and evaluation), `async_rollouts=True, "
        f"max_staleness={options.k}` (each batch sampled by the weights of {options.k} steps earlier, each sample used "
        f"once), {options.budget} generated tokens per run, 64 completions a step, lr 1e-4 constant; the arms differ "
        "only in the policy loss. A difference is resolved when its interval excludes 0; with 5 seeds a small effect is "
        "not (the v3 method asks for 8).\n\n" + "\n".join(lines)
    )
    print(table)
    record(f"Asynchronous rollouts: clip vs CISPO vs DPPO at k = {options.k} (tiny testbed)", table)
    return table


if __name__ == "__main__":
    main()
