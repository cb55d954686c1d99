"""Dynamic sampling off vs on, with extra rounds of a full batch (verl's DAPO) or sized from the keep rate (this
package's default): generation rounds per step, the groups that train, and what they cost in generated tokens.

DAPO on the tiny offline model with a binary reward (does the completion contain a digit?). As the policy learns,
more groups have all-equal rewards: without dynamic sampling they train nothing; with it, more rounds refill the
batch. The runs share the seed, so they see the same first round. Prints a markdown table (medians over steps). Usage:

    python bench/dynamic_sampling.py [--steps 30] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs, save_tiny_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402


def contains_digit(completions, **kwargs) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in text)) for text in texts]


MODES = {
    "off": (False, "keep_rate"),
    "on, full rounds (verl)": (True, "full"),
    "on, keep-rate rounds": (True, "keep_rate"),
}


def _summary(log_history: list[dict], args, dynamic: bool, wall: float) -> dict[str, float]:
    """Medians over the logged steps of a run: generation rounds, groups generated, kept and trained on, tokens per
    trained group, zero-variance groups; the last rewards, the round cap hits and the wall time."""
    logs = [entry for entry in log_history if "loss" in entry]
    zero_variance = [entry["frac_reward_zero_std"] for entry in logs]
    groups_per_batch = args.generation_batch_size // args.num_generations
    if dynamic:
        rounds = [entry["group_selection/generation_rounds"] for entry in logs]
        generated = [entry["group_selection/groups_generated"] for entry in logs]
        kept = [entry["group_selection/groups_kept"] / entry["group_selection/groups_generated"] for entry in logs]
        training = [entry["group_selection/groups_kept"] for entry in logs]
        per_group = [entry["group_selection/tokens_per_trained_group"] for entry in logs]
        cap = sum(entry["group_selection/round_cap_hit"] for entry in logs)
    else:  # one round; the groups that carry a gradient are the informative ones
        rounds, generated = [1.0] * len(logs), [float(groups_per_batch)] * len(logs)
        kept = [1.0 - z for z in zero_variance]
        training = [groups_per_batch * k for k in kept]
        tokens = [entry["completions/mean_length"] * args.generation_batch_size for entry in logs]
        per_group = [t / max(g, 1e-9) for t, g in zip(tokens, training)]
        cap = 0.0
    return {
        "rounds_median": statistics.median(rounds),
        "rounds_max": max(rounds),
        "generated_median": statistics.median(generated),
        "kept_fraction_median": statistics.median(kept),
        "training_groups_median": statistics.median(training),
        "tokens_per_group_median": statistics.median(per_group),
        "zero_variance_median": statistics.median(zero_variance),
        "reward_last5": statistics.mean(entry["reward"] for entry in logs[-5:]),
        "cap_hits": cap,
        "wall_s": wall,
    }


def run(
    model_path: str,
    dynamic: bool,
    extra_round_size: str,
    steps: int,
    output_dir: str,
    reward=contains_digit,
    dataset=None,
    overrides: dict | None = None,
    peft_config=None,
) -> dict[str, float]:
    """One DAPO run with dynamic sampling ``dynamic`` and ``extra_round_size``: the tiny model's workload by default;
    ``reward``, ``dataset``, ``overrides`` (config values) and ``peft_config`` give another (the real model's)."""
    if dataset is None:
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}="}]} for i in range(64)])
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=8,
        max_steps=steps,
        learning_rate=2e-3,
        logging_steps=1,
        seed=0,
    )
    settings.update(overrides or {})
    args = tr.DAPOConfig(
        **{**cpu_config_kwargs(), **settings}, dynamic_sampling=dynamic, extra_round_size=extra_round_size
    )
    trainer = tr.DAPOTrainer(
        model=model_path, reward_funcs=reward, args=args, train_dataset=dataset, peft_config=peft_config
    )
    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        trainer.train()
    wall = time.perf_counter() - start
    return _summary(trainer.state.log_history, args, dynamic, wall)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="3 steps: checks the script runs")
    options = parser.parse_args(argv)
    steps = 3 if options.quick else options.steps
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(save_tiny_model(os.path.join(tmp, "model"), seed=0))
        results = {name: run(model_path, *mode, steps, tmp) for name, mode in MODES.items()}
    lines = [
        f"Dynamic sampling, DAPO on the tiny model, binary 'contains a digit' reward, {steps} steps, "
        "4 groups of 4 per step (medians over steps)",
        "",
        "| dynamic sampling | rounds/step (median, max) | groups generated/step | share of generated groups that "
        "train | groups training per step | generated tokens per training group | zero-variance share of generated "
        "groups | reward (last 5 steps) | cap hits | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['rounds_median']:.1f}, {r['rounds_max']:.0f} | {r['generated_median']:.1f} | "
            f"{r['kept_fraction_median']:.2f} | {r['training_groups_median']:.1f} | {r['tokens_per_group_median']:.1f} "
            f"| {r['zero_variance_median']:.2f} | {r['reward_last5']:.3f} | {r['cap_hits']:.0f} | {r['wall_s']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("Dynamic sampling on vs off", table)
    return table


if __name__ == "__main__":
    main()
