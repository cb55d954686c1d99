"""Throughput of asynchronous rollouts against the synchronous run, same preset, in one run of this script.

    python bench/async_throughput.py --model real --steps 10 --seeds 0 1 2   # SmolLM2-135M-Instruct, LoRA
    python bench/async_throughput.py --model real --preset CISPO --arms sync-1t sync-2t process-k2
    python bench/async_throughput.py --model tiny --steps 30 --seeds 0 1 2   # the tiny Qwen2 of the tests
    python bench/async_throughput.py --model real-tools --arms sync-2t process-k1 --steps 6   # multi-turn, a tool

Arms (each a fresh process per seed, interleaved so that the machine's load hits every arm alike):

- ``sync-1t`` / ``sync-2t``: the synchronous run with one / two torch threads;
- ``process-k{K}``: ``async_rollouts=True, max_staleness=K, async_generator="process"``: the trainer (one thread) and
  the generator process (one thread) each on a core; ``process2t-k{K}``: the trainer on two threads beside it;
- ``inline-k{K}``: the same lag sampled in the training process (no overlap): what the lag alone costs.

For each arm: seconds per optimizer step (after ``--warmup`` steps, the worker's start excluded), trained completion
tokens per second, the ratio of throughputs to ``sync-1t`` and to ``sync-2t`` paired by seed (mean of log ratios, 95%
t interval), the training reward of the last 5 steps, and where the step's time went: the seconds spent in the
trainer's ``_generate`` (sampling, or the wait for the generator process: 0 when generation is fully hidden), the rest
of the trainer's step, and the generator process's own seconds per batch. Recorded in ``bench/RESULTS.md``; the runs
in ``bench/async_runs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import geometric_t_interval, require_recorded_runs, trainer_classes  # noqa: E402
from _results import read_runs, record, save_run  # noqa: E402

RUNS = Path(__file__).with_name("async_runs.json")


def arm_settings(arm: str) -> tuple[int, dict]:
    """``(torch threads of the trainer, config overrides)`` of an arm."""
    if arm.startswith("sync-"):
        return int(arm.removeprefix("sync-").removesuffix("t")), {"async_rollouts": False}
    generator, k = arm.split("-k")
    threads = 1
    if generator.endswith("2t"):  # the trainer on two threads beside the one-thread generator process
        generator, threads = generator.removesuffix("2t"), 2
    return threads, {"async_rollouts": True, "max_staleness": int(k), "async_generator": generator}


def _workload(model: str, output_dir: str) -> tuple[str, dict, dict]:
    """``(model path, config values, trainer arguments)`` of the real model's (LoRA, arithmetic) or the tiny model's
    workload."""
    from datasets import Dataset

    from trl_reasoning.models.tiny import cpu_config_kwargs

    if model == "real-tools":  # multi-turn: the tool-use task's warm-started SmolLM2 calling a multiply tool
        from peft import LoraConfig
        from transformers import AutoTokenizer

        from trl_reasoning.demo.run import REAL_MODEL_TRAINING
        from trl_reasoning.models.pretrained import smollm2_path
        from trl_reasoning.tasks.tool_use import TOOLS, ToolUseTask, tool_answer_reward, tool_tokenizer, warm_start

        path = str(warm_start(str(smollm2_path()))[0])
        settings = {**cpu_config_kwargs(), **REAL_MODEL_TRAINING}
        settings.update(dynamic_sampling=False, max_completion_length=96, max_tool_calling_iterations=2)
        settings.update(per_device_train_batch_size=8, num_generations=4, overlong_cache_length=None)  # as its bench
        extra = dict(
            reward_funcs=tool_answer_reward,
            train_dataset=Dataset.from_list(ToolUseTask().rl_rows("train")),
            processing_class=tool_tokenizer(AutoTokenizer.from_pretrained(path)),
            tools=list(TOOLS),
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
    elif model == "real":
        from peft import LoraConfig
        from transformers import AutoTokenizer

        from trl_reasoning.demo.run import REAL_MODEL_TRAINING
        from trl_reasoning.models.pretrained import smollm2_path
        from trl_reasoning.tasks.arithmetic import ArithmeticTask, last_number_reward

        path = str(smollm2_path())
        settings = {**cpu_config_kwargs(), **REAL_MODEL_TRAINING}
        settings.update(dynamic_sampling=False)  # one generation round a step: the pipeline's own effect
        extra = dict(
            reward_funcs=last_number_reward,
            train_dataset=Dataset.from_list(ArithmeticTask().rl_rows("train")),
            processing_class=AutoTokenizer.from_pretrained(path),
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
    else:
        from trl_reasoning.models.tiny import save_tiny_model
        from trl_reasoning.tasks.digit_reversal import digit_reward

        path = str(save_tiny_model(Path(output_dir) / "tiny", seed=0))
        settings = {
            **cpu_config_kwargs(),
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 32,
            "learning_rate": 1e-3,
            "dynamic_sampling": False,
        }
        prompts = [{"prompt": [{"role": "user", "content": f"{i}+{i * 7 % 10}="}]} for i in range(64)]
        extra = dict(reward_funcs=digit_reward, train_dataset=Dataset.from_list(prompts))
    return path, settings, extra


def _instrumented(trainer) -> tuple:
    """A callback timing the ends of the trainer's steps, and the list of seconds each training step spent in the
    trainer's ``_generate`` (sampling, or the wait for it), which it wraps."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    clock = Clock()
    trainer.add_callback(clock)
    generating: list[float] = []  # seconds in the trainer's _generate per training step: sampling, or the wait for it
    generate = trainer._generate

    def timed(prompts):
        started = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            if trainer.model.training:
                generating.append(time.perf_counter() - started)

    trainer._generate = timed
    return clock, generating


def worker(model: str, arm: str, seed: int, steps: int, warmup: int, preset: str = "DAPO") -> dict:
    import torch

    threads, overrides = arm_settings(arm)
    torch.set_num_threads(threads)
    output_dir = tempfile.mkdtemp()
    path, settings, extra = _workload(model, output_dir)
    settings.update(output_dir=output_dir, max_steps=warmup + steps, seed=seed, logging_steps=1, report_to="none")
    settings.update(overrides)
    config_class, trainer_class = trainer_classes(preset)
    args = config_class(**settings)
    trainer = trainer_class(model=path, args=args, **extra)

    clock, generating = _instrumented(trainer)
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    measured = history[warmup:]
    rows = args.per_device_train_batch_size
    tokens = sum(entry["completions/mean_length"] * rows for entry in measured)
    seconds = clock.ends[-1] - clock.ends[warmup - 1]
    generation = [entry["async/generation_seconds"] for entry in measured if "async/generation_seconds" in entry]
    wait = [entry["async/wait_seconds"] for entry in measured if "async/wait_seconds" in entry]
    return {
        "model": model,
        "preset": preset,
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "seconds_per_step": seconds / steps,
        "tokens_per_second": tokens / seconds,
        "reward_last5": statistics.fmean(entry["reward"] for entry in history[-5:]),
        "in_trainer_generation_seconds": statistics.fmean(generating[warmup:]),
        "generation_seconds": statistics.fmean(generation) if generation else None,
        "wait_seconds": statistics.fmean(wait) if wait else None,
        "load": os.getloadavg()[0],
    }


def _key(options, arm: str, seed: int) -> str:
    preset = "" if options.preset == "DAPO" else f"{options.preset}/"  # DAPO's keys predate --preset
    return f"{options.model}/{preset}{arm}/{seed}/{options.steps}"


def collect(options) -> None:
    """Every (seed, arm) in a fresh process, arms interleaved within a seed; finished runs are kept and skipped."""
    for seed in options.seeds:
        for arm in options.arms:
            key = _key(options, arm, seed)
            if key in read_runs(RUNS):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                job = json.dumps([options.model, arm, seed, options.preset])
                command = [sys.executable, __file__, "--worker", job, "--out", out]
                command += ["--steps", str(options.steps), "--warmup", str(options.warmup)]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise RuntimeError(f"{key} failed:\n{result.stderr[-4000:]}")
                run = json.loads(Path(out).read_text())
            save_run(RUNS, key, run)
            print(f"{key}: {run['seconds_per_step']:.2f} s/step, {run['tokens_per_second']:.1f} tokens/s", flush=True)


def _ratio(seeds: dict, base: dict) -> str:
    """Throughput of ``seeds`` over ``base``, paired by seed: geometric mean and 95% t interval."""
    paired = [seeds[s]["tokens_per_second"] / base[s]["tokens_per_second"] for s in seeds if s in base]
    if len(paired) < 2:
        return "–"
    mean, low, high = geometric_t_interval(paired)
    return f"{mean:.2f}x [{low:.2f}, {high:.2f}]"


def _mean(seeds: dict, field: str) -> str:
    values = [r[field] for r in seeds.values() if r.get(field) is not None]
    return f"{statistics.fmean(values):.2f}" if values else "–"


def summarize(options) -> str:
    runs = {_key(options, arm, seed): arm for arm in options.arms for seed in range(100)}
    by_arm: dict[str, dict] = {arm: {} for arm in options.arms}
    recorded = read_runs(RUNS)
    for key, run in recorded.items():
        if key in runs:
            by_arm[runs[key]][run["seed"]] = run
    require_recorded_runs(sum(map(len, by_arm.values())), RUNS, list(runs), list(recorded))
    lines = [
        "| arm | seeds | s/step (median) | trained tokens/s (mean) | vs sync-1t [95% t] | vs sync-2t [95% t] "
        "| reward, last 5 steps | in the trainer's generate, s/step | trainer's own work, s/step "
        "| generator process, s/batch |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for arm, seeds in by_arm.items():
        if not seeds:
            continue
        step = statistics.median(r["seconds_per_step"] for r in seeds.values())
        in_generate = [r.get("in_trainer_generation_seconds") for r in seeds.values()]
        own = (
            f"{statistics.fmean(r['seconds_per_step'] - r['in_trainer_generation_seconds'] for r in seeds.values()):.2f}"
            if None not in in_generate
            else "–"
        )
        lines.append(
            f"| {arm} | {len(seeds)} | {step:.2f} "
            f"| {statistics.fmean(r['tokens_per_second'] for r in seeds.values()):.1f} "
            f"| {_ratio(seeds, by_arm.get('sync-1t', {}))} | {_ratio(seeds, by_arm.get('sync-2t', {}))} "
            f"| {statistics.fmean(r['reward_last5'] for r in seeds.values()):.3f} "
            f"| {_mean(seeds, 'in_trainer_generation_seconds')} | {own} | {_mean(seeds, 'generation_seconds')} |"
        )
    loads = [r["load"] for seeds in by_arm.values() for r in seeds.values()]
    what = {
        "real": "SmolLM2-135M-Instruct with LoRA r=16, the main job's settings (16 completions of ≤ 16 tokens a step)",
        "real-tools": "the tool-use task's warm-started SmolLM2-135M-Instruct with LoRA r=16 and a multiply tool "
        "(8 multi-turn completions of ≤ 96 tokens, tool responses included, at most 2 tool-calling turns a step)",
        "tiny": "the tiny Qwen2 of the tests (16 completions of ≤ 32 tokens a step)",
    }[options.model]
    table = (
        f"{options.preset} (dynamic sampling off) on {what}, {options.steps} steps after {options.warmup} warm-up "
        f"steps, seeds {sorted({s for seeds in by_arm.values() for s in seeds})}, each run a fresh process. In the "
        "trainer's generate: sampling (synchronous and inline arms) or the wait for the generator process; the "
        "trainer's own work: the rest of its step (scoring, forward, backward, optimizer). Load average during the "
        f"runs: median {statistics.median(loads):.1f} (max {max(loads):.1f}) on {os.cpu_count()} CPU threads.\n\n"
        + "\n".join(lines)
    )
    print(table)
    preset = "" if options.preset == "DAPO" else f", {options.preset}"
    record(f"Asynchronous rollouts: throughput ({options.model} model{preset})", table)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "real", "real-tools"], default="tiny")
    parser.add_argument("--preset", default="DAPO", help="a preset's name (DAPO, CISPO, ScaleRL, ...)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["sync-1t", "sync-2t", "inline-k2", "process-k1", "process-k2"])
    parser.add_argument("--summarize", action="store_true", help="only the table, from the recorded runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        model, arm, seed, preset = json.loads(options.worker)
        Path(options.out).write_text(json.dumps(worker(model, arm, seed, options.steps, options.warmup, preset)))
        return
    if not options.summarize:
        collect(options)
    summarize(options)


if __name__ == "__main__":
    main()
