"""The demo: warm start a tiny model with SFT, train it with an RL preset, and measure it on held-out problems.

``trl-reasoning demo`` and ``python -m trl_reasoning.demo`` both land in [`run_demo`]. It prints a before/after table
(greedy held-out accuracy, pass@1, pass@k, mean completion length), saves the reward/accuracy curves as a PNG, and
writes the trained model folder with its model card.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .task import ReversalTask, exact_match_reward
from .warm_start import WarmStartSettings, warm_start


@dataclass
class DemoArguments:
    r"""
    Arguments of `trl-reasoning demo` (besides every field of the algorithm's config, which can be set too).

    Parameters:
        algorithm (`str`, *optional*, defaults to `"dapo"`):
            The preset to train with: a subcommand name of `trl-reasoning` (`dapo`, `cispo`, `dppo`, `maxrl`, `rloo`,
            `dr_grpo`, `scalerl`, …).
        fast (`bool`, *optional*, defaults to `False`):
            A smoke run (tiny warm start, a few RL steps, a small evaluation) for tests; its numbers mean nothing.
        warm_start_steps (`int`, *optional*, defaults to `400`):
            Optimizer steps of the supervised warm start.
        hidden_size (`int`, *optional*, defaults to `64`), num_layers (`int`, *optional*, defaults to `2`):
            Shape of the tiny Qwen2.
        num_digits, num_train, num_test, teacher_error_rate, task_seed:
            The task: see [`ReversalTask`].
        eval_num_samples (`int`, *optional*, defaults to `16`):
            Completions sampled per held-out prompt for pass@k (`n`).
        eval_k (`int`, *optional*, defaults to `8`):
            The `k` of the reported pass@k (pass@1 is always reported).
        eval_every (`int`, *optional*, defaults to `10`):
            Held-out evaluation (for the curve) every this many RL steps; `0` turns it off.
        num_threads (`int`, *optional*, defaults to `1`):
            torch intra-op threads while the demo runs (restored afterwards); `0` keeps torch's default. One thread is
            as fast for the tiny model, and with other processes on the cores, several threads spin against each
            other (measured here: SFT warm start 12 s with one thread, 567 s with two on a loaded 2-core machine).
        cache_dir (`str`, *optional*):
            Where the warm-start checkpoint is cached (default `$TRL_REASONING_CACHE` or `~/.cache/trl-reasoning`).
        no_cache (`bool`, *optional*, defaults to `False`):
            Retrain the warm start even if a cached one exists.
    """

    algorithm: str = field(default="dapo", metadata={"help": "The preset to train with (a trl-reasoning subcommand)."})
    fast: bool = field(default=False, metadata={"help": "Smoke run for tests: few steps, small evaluation."})
    warm_start_steps: int = field(default=400, metadata={"help": "Optimizer steps of the SFT warm start."})
    hidden_size: int = field(default=64, metadata={"help": "Hidden size of the tiny Qwen2."})
    num_layers: int = field(default=2, metadata={"help": "Layers of the tiny Qwen2."})
    num_digits: int = field(default=4, metadata={"help": "Digits per problem."})
    num_train: int = field(default=4000, metadata={"help": "Training problems."})
    num_test: int = field(default=200, metadata={"help": "Held-out problems (disjoint from training)."})
    teacher_error_rate: float = field(
        default=0.6, metadata={"help": "Fraction of warm-start demonstrations that copy instead of reversing."}
    )
    task_seed: int = field(default=0, metadata={"help": "Seed of the problem generator."})
    eval_num_samples: int = field(default=16, metadata={"help": "Samples per held-out prompt for pass@k (n)."})
    eval_k: int = field(default=8, metadata={"help": "k of the reported pass@k."})
    eval_every: int = field(default=10, metadata={"help": "Held-out evaluation every N RL steps (0 = off)."})
    num_threads: int = field(
        default=1,
        metadata={
            "help": "torch intra-op threads during the demo (0 = torch's default). The tiny model gains nothing from "
            "more, and on a busy machine spinning OpenMP threads slow the demo down tenfold or more."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Warm-start cache directory."})
    no_cache: bool = field(default=False, metadata={"help": "Retrain the warm start even if cached."})

    def task(self) -> ReversalTask:
        return ReversalTask(
            num_digits=self.num_digits,
            num_train=self.num_train,
            num_test=self.num_test,
            teacher_error_rate=self.teacher_error_rate,
            seed=self.task_seed,
        )

    def warm_start_settings(self) -> WarmStartSettings:
        return WarmStartSettings(
            hidden_size=self.hidden_size, num_layers=self.num_layers, max_steps=self.warm_start_steps
        )


#: DemoArguments values that `fast=True` uses instead of the defaults (explicit values still win).
FAST_DEMO_DEFAULTS: dict[str, Any] = {
    "warm_start_steps": 20,
    "num_train": 256,
    "num_test": 8,
    "eval_num_samples": 4,
    "eval_k": 4,
    "eval_every": 1,
}


def demo_training_defaults(num_digits: int = 4, fast: bool = False) -> dict[str, Any]:
    """Config values that the demo uses unless the command line or YAML sets them: CPU, fp32, a short run."""
    from .tiny import cpu_config_kwargs

    defaults = cpu_config_kwargs(
        output_dir="outputs/trl-reasoning-demo",
        per_device_train_batch_size=128,
        num_generations=8,
        max_completion_length=num_digits + 2,
        learning_rate=1e-3,
        max_steps=50,
        logging_steps=5,
        temperature=1.0,
        top_k=0,
        seed=0,
        log_level="warning",
        dataloader_num_workers=0,
    )
    if fast:
        # at most two generation rounds per step when dynamic sampling finds nothing to learn from (a smoke run)
        defaults.update(
            per_device_train_batch_size=16, num_generations=4, max_steps=2, logging_steps=1, max_num_gen_batches=2
        )
    return defaults


class _ProgressPrinter(TrainerCallback):
    """One short line per log: training reward and length, or held-out accuracy and pass@1."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" in logs:
            print(
                f"step {state.global_step:>4}: reward {logs['reward']:.3f}, completion length "
                f"{logs.get('completions/mean_length', float('nan')):.2f}, step time {logs.get('step_time', 0):.2f} s",
                flush=True,
            )
        if "eval_pass_at_k/pass@1" in logs:
            print(
                f"step {state.global_step:>4}: held-out accuracy {logs.get('eval_pass_at_k/accuracy', float('nan')):.3f}, "
                f"pass@1 {logs['eval_pass_at_k/pass@1']:.3f}",
                flush=True,
            )


def _row(label: str, metrics: dict[str, float], k: int) -> str:
    return (
        f"| {label} | {100 * metrics['accuracy']:.1f}% | {100 * metrics['pass@1']:.1f}% | "
        f"{100 * metrics[f'pass@{k}']:.1f}% | {metrics['mean_length']:.2f} |"
    )


def save_curves(path: Path, log_history: list[dict], evaluations: list[dict], title: str) -> Path | None:
    """Plot the training reward and the held-out accuracy / pass@1 against the step; `None` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train = [(e["step"], e["reward"]) for e in log_history if "reward" in e and "step" in e]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    if train:
        left.plot(*zip(*train), marker="o", color="tab:blue")
    left.set(title="training reward (mean over the batch)", xlabel="RL step", ylabel="reward", ylim=(-0.05, 1.05))
    if evaluations:
        steps = [e["step"] for e in evaluations]
        right.plot(steps, [e["eval_pass_at_k/accuracy"] for e in evaluations], marker="o", label="accuracy (greedy)")
        right.plot(steps, [e["eval_pass_at_k/pass@1"] for e in evaluations], marker="s", label="pass@1 (sampled)")
        right.legend(loc="lower right")
    right.set(title="held-out problems", xlabel="RL step", ylabel="fraction correct", ylim=(-0.05, 1.05))
    for axis in (left, right):
        axis.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_demo(demo: DemoArguments, training_args, trainer_class: type) -> dict[str, Any]:
    """
    Run the demo end to end, with `demo.num_threads` torch threads (restored afterwards).

    Args:
        demo ([`DemoArguments`]):
            Task, warm start and evaluation settings.
        training_args ([`ReasoningConfig`] subclass):
            The RL config (an instance of `trainer_class.config_class`).
        trainer_class (`type`):
            The trainer class; it gets the trl-reasoning model card if it does not have it already.

    Returns:
        `dict`: `before` and `after` metrics, `seconds` (wall time of each phase and in total), `output_dir`,
        `plot` (the PNG path or `None`), `warm_start_cached`.
    """
    import torch

    threads = torch.get_num_threads()
    if demo.num_threads > 0:
        torch.set_num_threads(demo.num_threads)
    try:
        return _run_demo(demo, training_args, trainer_class)
    finally:
        torch.set_num_threads(threads)


def _run_demo(demo: DemoArguments, training_args, trainer_class: type) -> dict[str, Any]:
    """The demo itself, with the threads already set."""
    import datasets
    import transformers
    from datasets import Dataset

    from ..callbacks import PassAtKCallback, evaluate_pass_at_k
    from ..loading import load_tokenizer

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()
    task = demo.task()
    ks = sorted({1, demo.eval_k})
    eval_options = dict(
        num_samples=demo.eval_num_samples,
        ks=ks,
        max_new_tokens=training_args.max_completion_length,
        temperature=training_args.temperature,
        top_k=training_args.top_k or 0,
        top_p=training_args.top_p,
        batch_size=64,
    )

    model_dir, cached = warm_start(task, demo.warm_start_settings(), demo.cache_dir, use_cache=not demo.no_cache)
    warm_seconds = time.perf_counter() - started
    print(f"warm start: {'cached' if cached else 'trained'} in {warm_seconds:.0f} s ({model_dir})", flush=True)

    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    test = Dataset.from_list(task.rl_rows("test"))
    before = evaluate_pass_at_k(model, tokenizer, test, exact_match_reward, **eval_options)
    trainer = trainer_class(
        model=model,
        reward_funcs=exact_match_reward,
        args=training_args,
        train_dataset=Dataset.from_list(task.rl_rows("train")),
        processing_class=tokenizer,
    )
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.add_callback(_ProgressPrinter())
    curve = None
    if demo.eval_every > 0:
        curve = PassAtKCallback(
            trainer,
            test,
            exact_match_reward,
            eval_steps=demo.eval_every,
            **{**eval_options, "ks": (1,), "num_samples": 4},
        )
        trainer.add_callback(curve)
    rl_started = time.perf_counter()
    trainer.train()
    rl_seconds = time.perf_counter() - rl_started
    after = evaluate_pass_at_k(trainer.model, tokenizer, test, exact_match_reward, **eval_options)

    output_dir = Path(training_args.output_dir)
    trainer.save_model(str(output_dir))
    trainer.create_model_card(model_name=output_dir.name, tags=["trl-reasoning-demo"])
    evaluations = [
        {"step": 0, "eval_pass_at_k/accuracy": before["accuracy"], "eval_pass_at_k/pass@1": before["pass@1"]}
    ]
    evaluations += curve.history if curve is not None else []
    evaluations.append(
        {
            "step": trainer.state.global_step,
            "eval_pass_at_k/accuracy": after["accuracy"],
            "eval_pass_at_k/pass@1": after["pass@1"],
        }
    )
    name = getattr(trainer, "_name", trainer_class.__name__)
    plot = save_curves(output_dir / "curves.png", trainer.state.log_history, evaluations, f"{name} on digit reversal")
    total = time.perf_counter() - started

    k = demo.eval_k
    print(
        f"\n{name} on digit reversal: {len(test)} held-out problems, {demo.eval_num_samples} samples each, "
        f"{trainer.state.global_step} RL steps"
    )
    print(f"| model | held-out accuracy (greedy) | pass@1 | pass@{k} | mean completion length (tokens) |")
    print("|---|---:|---:|---:|---:|")
    print(_row("warm start (SFT)", before, k))
    print(_row(f"after {name}", after, k))
    gain = 100 * (after["accuracy"] - before["accuracy"])
    print(
        f"\nheld-out accuracy {gain:+.1f} points, pass@1 {100 * (after['pass@1'] - before['pass@1']):+.1f} points; "
        f"wall time {total:.0f} s (warm start {warm_seconds:.0f} s, RL {rl_seconds:.0f} s)"
    )
    print(
        f"model and model card: {output_dir}" + (f"; curves: {plot}" if plot else " (install matplotlib for the PNG)")
    )
    result = {
        "algorithm": demo.algorithm,
        "before": before,
        "after": after,
        "seconds": {"warm_start": warm_seconds, "rl": rl_seconds, "total": total},
        "warm_start_cached": cached,
        "output_dir": str(output_dir),
        "plot": str(plot) if plot else None,
        "evaluations": evaluations,
    }
    (output_dir / "demo_results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
