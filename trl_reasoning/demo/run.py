"""The main job: train a model with an RL preset and measure it on held-out problems, offline.

``trl-reasoning demo`` and ``python -m trl_reasoning.demo`` both land in [`run_demo`]. Two models:

- ``--model smollm2-135m-instruct`` (the default): the real pretrained SmolLM2-135M-Instruct (converted once from the
  registry wheel, ``trl_reasoning.models.pretrained``) with LoRA on one-step arithmetic (``demo.arithmetic``);
- ``--model tiny`` (``--fast`` and the fast tests): a tiny Qwen2 warm-started with SFT on digit reversal taught by a
  sloppy teacher (``demo.task``).

It prints a before/after table (greedy held-out accuracy, pass@1, pass@k, mean completion length), saves the
reward/accuracy curves as a PNG, and writes the trained model folder with its model card.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..tasks.arithmetic import ArithmeticTask, last_number_reward
from ..tasks.digit_reversal import ReversalTask, exact_match_reward
from .warm_start import WarmStartSettings, warm_start

#: The model the main job trains unless told otherwise, and the name of the tiny one.
DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny"


@dataclass
class DemoArguments:
    r"""
    Arguments of `trl-reasoning demo` (besides every field of the algorithm's config, which can be set too).

    Parameters:
        algorithm (`str`, *optional*, defaults to `"dapo"`):
            The preset to train with: a subcommand name of `trl-reasoning` (`dapo`, `cispo`, `dppo`, `maxrl`, `rloo`,
            `dr_grpo`, `scalerl`, …).
        model (`str`, *optional*, defaults to `"smollm2-135m-instruct"`):
            `"smollm2-135m-instruct"`: the real pretrained SmolLM2-135M-Instruct, trained with LoRA on one-step
            arithmetic ([`ArithmeticTask`]). `"tiny"`: a tiny Qwen2 warm-started with SFT on digit reversal
            ([`ReversalTask`]); `fast=True` uses it unless a model is named.
        kinds (`str`, *optional*, defaults to `"add"`):
            Real model: the arithmetic kinds, comma-separated (`add`, `sub`, `mul`, `compare`).
        lora_r (`int`, *optional*, defaults to `16`):
            Real model: the LoRA rank on every linear layer; `0` trains every weight.
        fast (`bool`, *optional*, defaults to `False`):
            A smoke run (tiny warm start, a few RL steps, a small evaluation) for tests; its numbers mean nothing.
        warm_start_steps (`int`, *optional*, defaults to `400`):
            Tiny model: optimizer steps of the supervised warm start.
        hidden_size (`int`, *optional*, defaults to `64`), num_layers (`int`, *optional*, defaults to `2`):
            Shape of the tiny Qwen2.
        num_digits, teacher_error_rate:
            Tiny model's task: see [`ReversalTask`].
        num_train (`int`, *optional*), num_test (`int`, *optional*), task_seed (`int`, *optional*, defaults to `0`):
            Training rows, held-out problems (disjoint) and the seed of the task; `None` takes the model's defaults
            (tiny: 4000 and 200; real: 1024 and 32).
        eval_num_samples (`int`, *optional*), eval_k (`int`, *optional*, defaults to `8`):
            Completions sampled per held-out prompt for pass@k (`n`; tiny 16, real 8) and the reported `k`.
        eval_every (`int`, *optional*):
            Held-out evaluation (for the curve) every this many RL steps; `0` turns it off (tiny 10, real 0: each
            evaluation of the real model costs about as much as two training steps).
        num_threads (`int`, *optional*):
            torch intra-op threads while the demo runs (restored afterwards). `None` (auto): torch's default (one per
            core) less the cores other processes keep busy when the demo starts (`trl_reasoning.utils.threads`); `0`:
            torch's default; `n`: exactly `n`. On a busy machine spinning OpenMP threads slow a run several times
            (the tiny warm start 12 s with one thread, 567 s with two on a loaded 2-core machine); on a quiet one a
            second thread makes a SmolLM2 LoRA step 1.2x faster.
        cache_dir (`str`, *optional*):
            The cache of the warm start and the converted real model (default `$TRL_REASONING_CACHE` or
            `~/.cache/trl-reasoning`).
        no_cache (`bool`, *optional*, defaults to `False`):
            Retrain the warm start even if a cached one exists.
    """

    algorithm: str = field(default="dapo", metadata={"help": "The preset to train with (a trl-reasoning subcommand)."})
    model: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": f"'{DEFAULT_MODEL}' (the real pretrained model, LoRA, one-step arithmetic) or 'tiny' (a tiny "
            "Qwen2 warm-started on digit reversal; what --fast uses)."
        },
    )
    kinds: str = field(
        default="add", metadata={"help": "Real model: the arithmetic kinds, comma-separated (add, sub, mul, compare)."}
    )
    lora_r: int = field(
        default=16, metadata={"help": "Real model: LoRA rank on every linear layer (0 = full fine-tuning)."}
    )
    fast: bool = field(default=False, metadata={"help": "Smoke run for tests: few steps, small evaluation."})
    warm_start_steps: int = field(default=400, metadata={"help": "Tiny model: optimizer steps of the SFT warm start."})
    hidden_size: int = field(default=64, metadata={"help": "Hidden size of the tiny Qwen2."})
    num_layers: int = field(default=2, metadata={"help": "Layers of the tiny Qwen2."})
    num_digits: int = field(default=4, metadata={"help": "Tiny model: digits per problem."})
    num_train: int | None = field(default=None, metadata={"help": "Training rows (None: tiny 4000, real 1024)."})
    num_test: int | None = field(
        default=None, metadata={"help": "Held-out problems, disjoint from training (None: tiny 200, real 32)."}
    )
    teacher_error_rate: float = field(
        default=0.6,
        metadata={"help": "Tiny model: fraction of warm-start demonstrations that copy instead of reversing."},
    )
    task_seed: int = field(default=0, metadata={"help": "Seed of the problem generator."})
    eval_num_samples: int | None = field(
        default=None, metadata={"help": "Samples per held-out prompt for pass@k (n; None: tiny 16, real 8)."}
    )
    eval_k: int = field(default=8, metadata={"help": "k of the reported pass@k."})
    eval_every: int | None = field(
        default=None, metadata={"help": "Held-out evaluation every N RL steps (0 = off; None: tiny 10, real 0)."}
    )
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads during the demo: unset = auto (torch's default less the cores other "
            "processes keep busy when it starts), 0 = torch's default, n = exactly n."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache of the warm start and the real model."})
    no_cache: bool = field(default=False, metadata={"help": "Retrain the warm start even if cached."})

    def __post_init__(self):
        if self.model not in (DEFAULT_MODEL, TINY_MODEL):
            raise ValueError(f"demo: model must be {DEFAULT_MODEL!r} or {TINY_MODEL!r}, got {self.model!r}.")
        defaults = MODEL_DEFAULTS[self.model]
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @property
    def real(self) -> bool:
        return self.model != TINY_MODEL

    def task(self) -> ReversalTask:
        return ReversalTask(
            num_digits=self.num_digits,
            num_train=self.num_train,
            num_test=self.num_test,
            teacher_error_rate=self.teacher_error_rate,
            seed=self.task_seed,
        )

    def arithmetic_task(self) -> ArithmeticTask:
        kinds = tuple(kind.strip() for kind in self.kinds.split(",") if kind.strip())
        return ArithmeticTask(kinds=kinds, num_train=self.num_train, num_test=self.num_test, seed=self.task_seed)

    def warm_start_settings(self) -> WarmStartSettings:
        return WarmStartSettings(
            hidden_size=self.hidden_size, num_layers=self.num_layers, max_steps=self.warm_start_steps
        )


#: Per-model defaults of the DemoArguments fields left at None.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    TINY_MODEL: {"num_train": 4000, "num_test": 200, "eval_num_samples": 16, "eval_every": 10},
    DEFAULT_MODEL: {"num_train": 1024, "num_test": 32, "eval_num_samples": 8, "eval_every": 0},
}

#: DemoArguments values that `fast=True` uses instead of the defaults (explicit values still win).
FAST_DEMO_DEFAULTS: dict[str, Any] = {
    "warm_start_steps": 20,
    "num_train": 256,
    "num_test": 8,
    "eval_num_samples": 4,
    "eval_k": 4,
    "eval_every": 1,
}


def demo_training_defaults(num_digits: int = 4, fast: bool = False, model: str = TINY_MODEL) -> dict[str, Any]:
    """Config values that the demo uses unless the command line or YAML sets them: CPU, fp32, a short run."""
    from ..models.tiny import cpu_config_kwargs

    if model != TINY_MODEL:
        return cpu_config_kwargs(output_dir="outputs/trl-reasoning-demo", **REAL_MODEL_TRAINING)
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


#: The real model's training settings (measured choices; see bench/RESULTS.md, "The real model").
REAL_MODEL_TRAINING: dict[str, Any] = dict(
    per_device_train_batch_size=16,  # 2 prompts x 8 completions a step
    num_generations=8,
    max_completion_length=16,
    learning_rate=2e-4,  # LoRA r=16
    max_steps=30,
    logging_steps=1,
    temperature=1.0,
    top_k=0,
    seed=0,
    max_num_gen_batches=2,  # dynamic sampling: at most one extra round (generation is half a step's time)
    log_level="warning",
    dataloader_num_workers=0,
)


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
    Run the demo end to end, with the torch threads `demo.num_threads` resolves to (restored afterwards).

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
    from ..utils.threads import torch_threads

    with torch_threads(demo.num_threads) as threads:
        print(
            f"torch threads: {threads} (--num_threads {demo.num_threads if demo.num_threads is not None else 'auto'})"
        )
        return _run_demo(demo, training_args, trainer_class)


@dataclass
class _Setup:
    """What a demo model brings: the model (object or path) and tokenizer, the datasets and reward, its labels."""

    model: Any
    tokenizer: Any
    train: Any
    test: Any
    reward: Any
    task_name: str
    start_label: str
    prepared: str
    peft_config: Any = None


def _tiny_setup(demo: DemoArguments) -> _Setup:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from ..models.loading import load_tokenizer

    task = demo.task()
    model_dir, cached = warm_start(task, demo.warm_start_settings(), demo.cache_dir, use_cache=not demo.no_cache)
    return _Setup(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        tokenizer=load_tokenizer(model_dir),
        train=Dataset.from_list(task.rl_rows("train")),
        test=Dataset.from_list(task.rl_rows("test")),
        reward=exact_match_reward,
        task_name="digit reversal",
        start_label="warm start (SFT)",
        prepared=f"warm start: {'cached' if cached else 'trained'} in {{seconds:.0f}} s ({model_dir})",
    )


def _real_setup(demo: DemoArguments) -> _Setup:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from ..models.loading import load_tokenizer
    from ..models.pretrained import smollm2_path

    path = smollm2_path(demo.cache_dir)
    task = demo.arithmetic_task()
    peft_config = None
    if demo.lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=demo.lora_r, lora_alpha=2 * demo.lora_r, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    return _Setup(
        model=AutoModelForCausalLM.from_pretrained(path),
        tokenizer=load_tokenizer(path),
        train=Dataset.from_list(task.rl_rows("train")),
        test=Dataset.from_list(task.rl_rows("test")),
        reward=last_number_reward,
        task_name=f"one-step arithmetic ({', '.join(task.kinds)})",
        start_label="SmolLM2-135M-Instruct",
        prepared=f"model: SmolLM2-135M-Instruct ({path}), "
        + (f"LoRA r={demo.lora_r}" if peft_config else "full fine-tuning")
        + ", ready in {seconds:.0f} s",
        peft_config=peft_config,
    )


def _eval_options(demo: DemoArguments, training_args) -> dict[str, Any]:
    """`evaluate_pass_at_k`'s sampling options for the before/after evaluations, from the RL sampling settings."""
    return dict(
        num_samples=demo.eval_num_samples,
        ks=sorted({1, demo.eval_k}),
        max_new_tokens=training_args.max_completion_length,
        temperature=training_args.temperature,
        top_k=training_args.top_k or 0,
        top_p=training_args.top_p,
        batch_size=64 if not demo.real else 8,
    )


def _demo_trainer(demo: DemoArguments, setup: _Setup, training_args, trainer_class: type, eval_options: dict):
    """The trainer of the demo, printing one line per step, and its pass@k curve callback (`None` without
    `eval_every`)."""
    import transformers

    from ..evaluation.callbacks import PassAtKCallback

    trainer = trainer_class(
        model=setup.model,
        reward_funcs=setup.reward,
        args=training_args,
        train_dataset=setup.train,
        processing_class=setup.tokenizer,
        peft_config=setup.peft_config,
    )
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.add_callback(_ProgressPrinter())
    curve = None
    if demo.eval_every > 0:
        curve_options = {**eval_options, "ks": (1,), "num_samples": 4}
        curve = PassAtKCallback(trainer, setup.test, setup.reward, eval_steps=demo.eval_every, **curve_options)
        trainer.add_callback(curve)
    return trainer, curve


def _evaluation_points(before: dict, after: dict, curve, steps: int) -> list[dict]:
    """The held-out accuracy and pass@1 before training, along the curve (if any) and after `steps` RL steps."""

    def point(step: int, metrics: dict) -> dict:
        return {
            "step": step,
            "eval_pass_at_k/accuracy": metrics["accuracy"],
            "eval_pass_at_k/pass@1": metrics["pass@1"],
        }

    return [point(0, before)] + (curve.history if curve is not None else []) + [point(steps, after)]


def _print_summary(demo: DemoArguments, setup: _Setup, name: str, result: dict) -> None:
    """The before/after table, the gains, the wall time and where the outputs are."""
    before, after, seconds, k = result["before"], result["after"], result["seconds"], demo.eval_k
    print(
        f"\n{name} on {setup.task_name}: {len(setup.test)} held-out problems, {demo.eval_num_samples} samples each, "
        f"{result['steps']} RL steps"
    )
    print(f"| model | held-out accuracy (greedy) | pass@1 | pass@{k} | mean completion length (tokens) |")
    print("|---|---:|---:|---:|---:|")
    print(_row(setup.start_label, before, k))
    print(_row(f"after {name}", after, k))
    gain = 100 * (after["accuracy"] - before["accuracy"])
    # pass@1 is a mean over samples: another seed draws others. A bound on that alone (the prompts fixed): a 95%
    # half-width of 1.96 * sqrt(p (1 - p) / samples), the larger of before's and after's. Greedy accuracy has none.
    spread = max(
        196 * math.sqrt(max(r["pass@1"] * (1 - r["pass@1"]), 0.0) / max(r["num_prompts"] * r["num_samples"], 1))
        for r in (before, after)
    )
    print(
        f"\nheld-out accuracy {gain:+.1f} points, pass@1 {100 * (after['pass@1'] - before['pass@1']):+.1f} points "
        f"(each pass@1 within ±{spread:.1f} points from sampling alone; the evaluation is seeded); "
        f"wall time {seconds['total']:.0f} s (model {seconds['model']:.0f} s, evaluation {seconds['evaluation']:.0f} "
        f"s, RL {seconds['rl']:.0f} s)"
    )
    plot = result["plot"]
    print(
        f"model and model card: {result['output_dir']}"
        + (f"; curves: {plot}" if plot else " (install matplotlib for the PNG)")
    )


def _run_demo(demo: DemoArguments, training_args, trainer_class: type) -> dict[str, Any]:
    """The demo itself, with the threads already set."""
    import datasets
    import transformers

    from ..evaluation.callbacks import evaluate_pass_at_k

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()
    eval_options = _eval_options(demo, training_args)
    setup = (_real_setup if demo.real else _tiny_setup)(demo)
    prepare_seconds = time.perf_counter() - started
    print(setup.prepared.format(seconds=prepare_seconds), flush=True)

    eval_started = time.perf_counter()
    before = evaluate_pass_at_k(setup.model, setup.tokenizer, setup.test, setup.reward, **eval_options)
    eval_seconds = time.perf_counter() - eval_started
    print(
        f"before: held-out accuracy {before['accuracy']:.3f}, pass@1 {before['pass@1']:.3f} ({eval_seconds:.0f} s)",
        flush=True,
    )
    trainer, curve = _demo_trainer(demo, setup, training_args, trainer_class, eval_options)
    rl_started = time.perf_counter()
    trainer.train()
    rl_seconds = time.perf_counter() - rl_started
    eval_started = time.perf_counter()
    after = evaluate_pass_at_k(trainer.model, setup.tokenizer, setup.test, setup.reward, **eval_options)
    eval_seconds += time.perf_counter() - eval_started

    output_dir = Path(training_args.output_dir)
    trainer.save_model(str(output_dir))
    trainer.create_model_card(model_name=output_dir.name, tags=["trl-reasoning-demo"])
    evaluations = _evaluation_points(before, after, curve, trainer.state.global_step)
    name = getattr(trainer, "_name", trainer_class.__name__)
    title = f"{name} on {setup.task_name}"
    plot = save_curves(output_dir / "curves.png", trainer.state.log_history, evaluations, title)
    total = time.perf_counter() - started
    result = {
        "algorithm": demo.algorithm,
        "model": demo.model,
        "task": setup.task_name,
        "before": before,
        "after": after,
        "seconds": {
            "model": prepare_seconds,
            "warm_start": prepare_seconds,
            "evaluation": eval_seconds,
            "rl": rl_seconds,
            "total": total,
        },
        "warm_start_cached": "warm start: cached" in setup.prepared,
        "output_dir": str(output_dir),
        "plot": str(plot) if plot else None,
        "evaluations": evaluations,
        "steps": trainer.state.global_step,
    }
    _print_summary(demo, setup, name, result)
    (output_dir / "demo_results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
