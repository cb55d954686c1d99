"""The papers' claims in miniature: every algorithm on the embedded digit-reversal task, same warm start, same
budget, several seeds.

For TRL's GRPOTrainer (its defaults), DAPO with and without dynamic sampling, CISPO, DPPO, MaxRL, RLOO, Dr. GRPO and
ScaleRL: held-out greedy accuracy every few steps, pass@k for k = 1..16 at the end, the mean length of correct and
incorrect sampled completions, and ScaleRL's compute curve (``fit_compute_curve`` on accuracy vs tokens processed).
Prints markdown tables and a verdict on three claims, records them in bench/RESULTS.md and saves a PNG of the curves.

    python bench/miniature.py [--seeds 3] [--steps 50] [--quick]

The task is small and saturates (every method ends near 100% greedy accuracy), so differences are small; the
verdicts report what was measured, including claims that do not reproduce here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import preset_methods, trainer_classes  # noqa: E402
from _results import record  # noqa: E402

#: method -> (trainer name for _common.trainer_classes, config overrides): TRL's GRPO, then every preset of
#: ``trl_reasoning.presets.PRESETS`` with its defaults.
METHODS = {
    "TRL GRPO": ("trl.GRPO", {}),
    **preset_methods(
        labels={"dapo": "DAPO (dynamic sampling)"},
        variants={"dapo": {"DAPO (no dynamic sampling)": ("DAPO", {"dynamic_sampling": False})}},
    ),
}
MAX_K = 16
TARGET_ACCURACY = 0.9


def lengths_by_correctness(model, tokenizer, rows, num_samples: int, max_new_tokens: int) -> tuple[float, float]:
    """Mean length (tokens, EOS included) of sampled completions that are correct and of those that are not."""
    from trl_reasoning.evaluation.callbacks import _prompt_texts, _sample
    from trl_reasoning.tasks.digit_reversal import exact_match_reward

    correct, incorrect = [], []
    for start in range(0, len(rows), 64):
        chunk = rows[start : start + 64]
        sampled = _sample(
            model,
            tokenizer,
            _prompt_texts(tokenizer, [r["prompt"] for r in chunk]),
            num_samples,
            False,
            {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_k": 0, "pad_token_id": tokenizer.pad_token_id},
        )
        answers = [r["answer"] for r in chunk for _ in range(num_samples)]
        completions = [[{"role": "assistant", "content": text}] for text in sampled["texts"]]
        for reward, length in zip(exact_match_reward(completions, answers), sampled["lengths"]):
            (correct if reward >= 1.0 else incorrect).append(length)
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    return mean(correct), mean(incorrect)


def _accuracy_points(log_history: list[dict], curve_history: list[dict], before: dict, after: dict, global_step: int):
    """``(step, tokens trained on, held-out accuracy)`` before training, at each evaluation and after the last step."""
    tokens = {e["step"]: e["num_tokens"] for e in log_history if "num_tokens" in e}
    points = [(0, 0.0, before["accuracy"])]
    for entry in curve_history:
        step = entry["step"]
        points.append((step, tokens.get(step, float("nan")), entry["eval_pass_at_k/accuracy"]))
    if points[-1][0] != global_step:
        last = max(tokens) if tokens else global_step
        points.append((global_step, tokens.get(last, float("nan")), after["accuracy"]))
    return points


def run_one(method: str, seed: int, steps: int, eval_every: int, model_dir: str, task, quick: bool) -> dict:
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_reasoning.demo.run import demo_training_defaults
    from trl_reasoning.evaluation.callbacks import PassAtKCallback, evaluate_pass_at_k
    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.tasks.digit_reversal import exact_match_reward

    key, overrides = METHODS[method]
    config_class, trainer_class = trainer_classes(key)
    defaults = demo_training_defaults(task.num_digits)
    defaults.update(output_dir=f"outputs/miniature/{key}-{seed}", seed=seed, max_steps=steps, save_strategy="no")
    if quick:
        defaults.update(per_device_train_batch_size=16, num_generations=4, max_num_gen_batches=2)
    if key == "trl.GRPO":
        defaults.pop("max_num_gen_batches", None)
    args = config_class(**{**defaults, **overrides})
    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    test = Dataset.from_list(task.rl_rows("test"))
    eval_options = dict(max_new_tokens=args.max_completion_length, temperature=1.0, top_k=0, batch_size=64)
    trainer = trainer_class(
        model=model,
        reward_funcs=exact_match_reward,
        args=args,
        train_dataset=Dataset.from_list(task.rl_rows("train")),
        processing_class=tokenizer,
    )
    trainer.remove_callback(transformers.PrinterCallback)
    curve = PassAtKCallback(
        trainer, test, exact_match_reward, eval_steps=eval_every, ks=(1,), num_samples=4, **eval_options
    )
    trainer.add_callback(curve)
    before = evaluate_pass_at_k(model, tokenizer, test, exact_match_reward, num_samples=4, ks=(1,), **eval_options)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    samples = 4 if quick else MAX_K
    ks = list(range(1, samples + 1))
    after = evaluate_pass_at_k(
        trainer.model, tokenizer, test, exact_match_reward, num_samples=samples, ks=ks, **eval_options
    )
    correct_len, incorrect_len = lengths_by_correctness(
        trainer.model, tokenizer, task.rl_rows("test"), samples, args.max_completion_length
    )
    points = _accuracy_points(trainer.state.log_history, curve.history, before, after, trainer.state.global_step)
    return {
        "points": points,
        "pass_at_k": [after[f"pass@{k}"] for k in ks],
        "final_accuracy": after["accuracy"],
        "correct_length": correct_len,
        "incorrect_length": incorrect_len,
        "seconds": seconds,
    }


def steps_to(points, target: float) -> float:
    return next((step for step, _, accuracy in points if accuracy >= target), float("inf"))


def _at(pass_k: list[float], k: int) -> float:
    return pass_k[k - 1] if k <= len(pass_k) else float("nan")


def summarize(results: dict[str, list[dict]], steps: int, seeds: int) -> tuple[str, dict]:
    from trl_reasoning.evaluation.compute_curves import fit_compute_curve

    mean = statistics.mean
    lines = [
        f"Digit reversal (4 digits, 200 held-out strings), shared cached SFT warm start, {steps} RL steps, "
        f"{seeds} seeds; medians/means over seeds. Accuracy = greedy held-out accuracy.",
        "",
        "| method | accuracy at steps "
        + " / ".join(str(p[0]) for p in results["TRL GRPO"][0]["points"])
        + f" (mean) | steps to {TARGET_ACCURACY:.0%} (median) | pass@1 | pass@4 | pass@16 | length correct / incorrect "
        "| compute-curve A ± se, B ± se, C_mid (tokens), R² | RL s/run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for method, runs in results.items():
        curves = [[p[2] for p in run["points"]] for run in runs]
        width = min(len(c) for c in curves)
        mean_curve = [mean(c[i] for c in curves) for i in range(width)]
        to_target = statistics.median(steps_to(run["points"], TARGET_ACCURACY) for run in runs)
        pass_k = [mean(run["pass_at_k"][i] for run in runs) for i in range(len(runs[0]["pass_at_k"]))]
        correct = mean(run["correct_length"] for run in runs)
        incorrect_values = [
            run["incorrect_length"] for run in runs if run["incorrect_length"] == run["incorrect_length"]
        ]
        incorrect = mean(incorrect_values) if incorrect_values else float("nan")
        try:
            measured = [(c, r) for run in runs for _, c, r in run["points"] if c == c]  # c == c: not NaN
            compute, reward = [c for c, _ in measured], [r for _, r in measured]
            fit = fit_compute_curve(compute, reward)
            fit_text = (
                f"{fit.A:.3f} ± {fit.A_stderr:.3f}, {fit.B:.2f} ± {fit.B_stderr:.2f}, {fit.C_mid:.3g}, "
                f"{fit.r_squared:.2f}"
            )
        except (ValueError, FloatingPointError, OverflowError) as error:
            fit_text = f"no fit ({error})"
        summary[method] = {"pass_k": pass_k, "to_target": to_target, "incorrect": incorrect, "correct": correct}
        lines.append(
            f"| {method} | {' / '.join(f'{a:.2f}' for a in mean_curve)} | {to_target} | {_at(pass_k, 1):.3f} | "
            f"{_at(pass_k, 4):.3f} | {_at(pass_k, 16):.3f} | {correct:.2f} / {incorrect:.2f} | {fit_text} | "
            f"{statistics.median(run['seconds'] for run in runs):.0f} |"
        )
    return "\n".join(lines), summary


def verdicts(summary: dict) -> str:
    grpo, maxrl, drgrpo = summary["TRL GRPO"], summary["MaxRL"], summary["Dr. GRPO"]
    ds_on, ds_off = summary["DAPO (dynamic sampling)"], summary["DAPO (no dynamic sampling)"]
    k = len(grpo["pass_k"])
    claims = [
        (
            f"MaxRL's pass@{k} >= GRPO's",
            maxrl["pass_k"][-1] >= grpo["pass_k"][-1],
            f"MaxRL {maxrl['pass_k'][-1]:.3f} vs GRPO {grpo['pass_k'][-1]:.3f}",
        ),
        (
            "Dr. GRPO's incorrect completions not longer than GRPO's",
            not drgrpo["incorrect"] > grpo["incorrect"],
            f"Dr. GRPO {drgrpo['incorrect']:.2f} vs GRPO {grpo['incorrect']:.2f} tokens (the answer has a fixed length, "
            "so this task can hardly show a length bias)",
        ),
        (
            f"dynamic sampling reaches {TARGET_ACCURACY:.0%} held-out accuracy in fewer steps",
            ds_on["to_target"] < ds_off["to_target"],
            f"{ds_on['to_target']} vs {ds_off['to_target']} steps (median; it generates more per step)",
        ),
    ]
    lines = ["| claim | reproduces here? | measured |", "|---|---|---|"]
    for claim, holds, measured in claims:
        lines.append(f"| {claim} | {'yes' if holds else 'no'} | {measured} |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for method, runs in results.items():
        width = min(len(run["points"]) for run in runs)
        steps = [runs[0]["points"][i][0] for i in range(width)]
        left.plot(
            steps,
            [statistics.mean(run["points"][i][2] for run in runs) for i in range(width)],
            marker="o",
            label=method,
        )
        ks = range(1, len(runs[0]["pass_at_k"]) + 1)
        right.plot(list(ks), [statistics.mean(run["pass_at_k"][k - 1] for run in runs) for k in ks], label=method)
    left.set(title="held-out greedy accuracy (mean over seeds)", xlabel="RL step", ylim=(-0.02, 1.02))
    right.set(title="pass@k after training", xlabel="k", xscale="log")
    left.legend(fontsize=7)
    for axis in (left, right):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="1 seed, 2 steps, tiny warm start: checks the script runs"
    )
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers

    from trl_reasoning.demo.run import DemoArguments
    from trl_reasoning.demo.warm_start import warm_start

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from more (see DemoArguments.num_threads)
    demo = DemoArguments(fast=options.quick)
    if options.quick:
        demo.warm_start_steps, demo.num_train, demo.num_test = 20, 256, 8
        options.seeds, options.steps, options.eval_every = 1, 2, 1
    task = demo.task()
    model_dir, _ = warm_start(task, demo.warm_start_settings())
    results: dict[str, list[dict]] = {method: [] for method in METHODS}
    try:
        for seed in range(options.seeds):
            for method in METHODS:
                results[method].append(
                    run_one(method, seed, options.steps, options.eval_every, str(model_dir), task, options.quick)
                )
                print(f"seed {seed} {method}: accuracy {results[method][-1]['final_accuracy']:.3f}", flush=True)
    finally:
        torch.set_num_threads(threads)
    table, summary = summarize(results, options.steps, options.seeds)
    claims = verdicts(summary)
    text = table + "\n\n" + claims
    print(text)
    if not options.quick:
        plot(results, Path(__file__).with_name("miniature.png"))
        record("The papers in miniature", text + "\n\n![curves](miniature.png)")
    return text


if __name__ == "__main__":
    main()
