"""The benches on the real model: SmolLM2-135M-Instruct (134.5M parameters, vocabulary 49,152), offline.

Each prints a markdown table and records it in ``bench/RESULTS.md`` ("The real model: ..."), next to the tiny-model
rows, which stay:

    python bench/real_model.py gain [--seeds 0 1 2]          # the main job's held-out gain over seeds (t interval)
    python bench/real_model.py overhead [--sessions 2] [--steps 6]   # ours vs GRPOTrainer, split by phase
    python bench/real_model.py topk-memory [--length 128]    # DPPO top-K vs binary vs the full-logits path
    python bench/real_model.py dynamic-sampling [--steps 12] # generated tokens per trained group

``gain`` runs the README's main job (``trl-reasoning demo``) once per seed in a fresh process and keeps every finished
run in ``bench/real_model_runs.json``: it resumes where it stopped (a run is hours of CPU for many seeds). The seed is
the training seed (sampling, LoRA init); the held-out set is the same for every seed, so the gain is paired by seed.
Machines are shared: every table says how loaded the machine was (the load average while it ran).
"""

from __future__ import annotations

import argparse
import json
import math
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

from _common import t_interval, use_free_cores  # noqa: E402
from _results import load_average, read_runs, record, save_run  # noqa: E402

RUNS = Path(__file__).with_name("real_model_runs.json")


# ------------------------------------------------------------------------------------------------------------- gain


def _gain_run(options, seed: int) -> None:
    """The main job with ``seed`` in a fresh process, recorded in the runs file (skipped when recorded already)."""
    key = f"gain/{options.algorithm}/{seed}"
    if key in read_runs(RUNS) and not options.rerun:
        print(f"{key}: recorded, skipped", flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "trl_reasoning.demo",
            "--algorithm",
            options.algorithm,
            "--seed",
            str(seed),
            "--output_dir",
            tmp,
            *(["--num_threads", str(options.num_threads)] if options.num_threads is not None else []),
            *options.demo_args,
        ]
        started = time.time()
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
        outcome = json.loads((Path(tmp) / "demo_results.json").read_text())
    outcome["wall_s"] = time.time() - started
    outcome["load"] = load_average()
    outcome.pop("evaluations", None)
    save_run(RUNS, key, outcome)
    print(
        f"{key}: accuracy {outcome['before']['accuracy']:.3f} -> {outcome['after']['accuracy']:.3f}, pass@1 "
        f"{outcome['before']['pass@1']:.3f} -> {outcome['after']['pass@1']:.3f}, {outcome['wall_s']:.0f} s",
        flush=True,
    )


def gain(options) -> str:
    """The main job, once per seed, each in a fresh process; finished seeds are kept and skipped."""
    for seed in options.seeds:
        _gain_run(options, seed)
    runs = [value for key, value in read_runs(RUNS).items() if key.startswith(f"gain/{options.algorithm}/")]
    rows = [
        "| metric | before (mean) | after (mean) | gain, mean [95% t interval] | seeds |",
        "|---|---:|---:|---|---:|",
    ]
    for metric in ("accuracy", "pass@1", "pass@8", "mean_length"):
        before = [run["before"][metric] for run in runs if metric in run["before"]]
        after = [run["after"][metric] for run in runs if metric in run["after"]]
        if not before:
            continue
        scale, unit = (1.0, " tokens") if metric == "mean_length" else (100.0, " pts")
        mean, low, high = t_interval([scale * (a - b) for a, b in zip(after, before, strict=True)])
        label = {"accuracy": "held-out accuracy (greedy)", "mean_length": "completion length"}.get(metric, metric)
        rows.append(
            f"| {label} | {scale * statistics.fmean(before):.1f} | {scale * statistics.fmean(after):.1f} | "
            f"{mean:+.1f}{unit} [{low:+.1f}, {high:+.1f}] | {len(before)} |"
        )
    walls = [run["wall_s"] for run in runs]
    seconds = [run["seconds"] for run in runs]
    details = (
        f"The main job (`trl-reasoning demo --algorithm {options.algorithm}`: SmolLM2-135M-Instruct, LoRA, one-step "
        f"addition, {runs[0].get('steps', '?')} RL steps, {int(runs[0]['before']['num_prompts'])} held-out questions "
        f"x {int(runs[0]['before']['num_samples'])} samples) once per training seed; the gain is after − before per "
        f"seed. Wall time per run: median {statistics.median(walls):.0f} s (model "
        f"{statistics.median(s['model'] for s in seconds):.0f} s, evaluation "
        f"{statistics.median(s['evaluation'] for s in seconds):.0f} s, RL {statistics.median(s['rl'] for s in seconds):.0f}"
        f" s); machine: {runs[-1]['load']} during the last run."
    )
    table = details + "\n\n" + "\n".join(rows)
    print(table)
    record(f"The real model: held-out gain of the main job ({options.algorithm})", table)
    return table


# ------------------------------------------------------------------------------------------------------------- overhead


class PhaseClock:
    """Per-step time of each phase of a trainer's step, from wrappers around the methods that make it: generation
    (the model's ``generate``), reward (the reward functions), the rest of scoring (tokenizing, decoding, the no-grad
    log-probs), the loss forward (``compute_loss``), the backward (the rest of ``training_step``) and the optimizer and
    the rest of the step (outside ``training_step``)."""

    PHASES = ("generation", "reward", "scoring (rest)", "loss forward", "backward", "optimizer + rest")

    def __init__(self, trainer):
        self.totals = {name: 0.0 for name in ("generate", "reward", "score", "loss", "step")}
        self.steps: list[dict[str, float]] = []
        model = trainer.model
        model.generate = self._timed(model.generate, "generate")
        trainer.reward_funcs = [self._timed_reward(func) for func in trainer.reward_funcs]
        trainer._generate_and_score_completions = self._timed(trainer._generate_and_score_completions, "score")
        trainer.compute_loss = self._timed(trainer.compute_loss, "loss")
        trainer.training_step = self._timed(trainer.training_step, "step")

    def _timed(self, function, name):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - started

        return timed

    def _timed_reward(self, function):
        if isinstance(function, torch.nn.Module):
            return function
        timed = self._timed(function, "reward")
        timed.__name__ = function.__name__
        return timed

    def close_step(self, wall: float) -> None:
        t = self.totals
        self.steps.append(
            {
                "generation": t["generate"],
                "reward": t["reward"],
                "scoring (rest)": t["score"] - t["generate"] - t["reward"],
                "loss forward": t["loss"],
                "backward": t["step"] - t["score"] - t["loss"],
                "optimizer + rest": wall - t["step"],
                "step": wall,
            }
        )
        for name in t:
            t[name] = 0.0


def _real_trainer(side: str, steps: int, output_dir: str):
    from _common import trainer_classes
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_reasoning.demo.run import REAL_MODEL_TRAINING
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.arithmetic import ArithmeticTask, last_number_reward

    path = str(smollm2_path())
    settings = {**cpu_config_kwargs(), **REAL_MODEL_TRAINING, "max_steps": steps, "output_dir": output_dir}
    if side == "ours":  # DAPO's objective, token-mean loss; dynamic sampling and overlong shaping do more on purpose
        config_class, trainer_class = trainer_classes("DAPO")
        settings.update(dynamic_sampling=False, overlong_cache_length=None)
    else:
        config_class, trainer_class = trainer_classes("trl.GRPO")
        settings.update(loss_type="dapo", epsilon_high=0.28)
        settings.pop("max_num_gen_batches", None)
    return trainer_class(
        model=path,
        reward_funcs=last_number_reward,
        args=config_class(**settings),
        train_dataset=Dataset.from_list(ArithmeticTask().rl_rows("train")),
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )


def overhead(options) -> str:
    """Ours (DAPO) and GRPOTrainer (loss_type="dapo") on the real model, in strict turns of one step (overhead.py's
    sessions), each step split by phase."""
    from overhead import interleaved_session, ratio_interval
    from transformers import TrainerCallback

    use_free_cores(options.num_threads)  # as the main job: torch's default less the cores other processes keep busy
    sessions: dict[str, list[list[float]]] = {"ours": [], "trl": []}
    phases: dict[str, list[dict[str, float]]] = {"ours": [], "trl": []}

    class StepWall(TrainerCallback):
        def __init__(self, clock):
            self.clock = clock

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock.close_step(time.perf_counter() - self.started)

    clocks: dict[str, PhaseClock] = {}

    def build(side: str):
        trainer = _real_trainer(side, options.warmup + options.steps, tempfile.mkdtemp())
        clocks[side] = PhaseClock(trainer)
        trainer.add_callback(StepWall(clocks[side]))
        return trainer

    for session in range(options.sessions):
        first = "ours" if session % 2 == 0 else "trl"
        turns = interleaved_session(build, first, seed=session)
        for side in ("ours", "trl"):
            walls = turns[side].wall[options.warmup :]
            sessions[side].append(walls)
            phases[side] += clocks[side].steps[options.warmup :]
    logs = [
        [math.log(a / b) for a, b in zip(ours, theirs, strict=True)]
        for ours, theirs in zip(sessions["ours"], sessions["trl"], strict=True)
    ]
    ratio, low, high = ratio_interval(logs)
    rows = [
        "| phase | ours, median s/step | GRPOTrainer, median s/step | share of our step |",
        "|---|---:|---:|---:|",
    ]
    ours_step = statistics.median(p["step"] for p in phases["ours"])
    for name in (*PhaseClock.PHASES, "step"):
        ours = statistics.median(p[name] for p in phases["ours"])
        theirs = statistics.median(p[name] for p in phases["trl"])
        rows.append(f"| {name} | {ours:.2f} | {theirs:.2f} | {100 * ours / ours_step:.0f}% |")
    table = (
        f'DAPO (dynamic sampling and overlong shaping off) against `GRPOTrainer(loss_type="dapo", epsilon_high=0.28)` '
        f"on SmolLM2-135M-Instruct with LoRA r=16 (all linear layers), the main job's settings (16 completions of ≤ 16 "
        f"tokens a step, one torch thread), strict turns of one step, {options.sessions} sessions x {options.steps} "
        f"steps after {options.warmup} warm-up steps. Step-time ratio ours / TRL: **{ratio:.3f} [{low:.3f}, "
        f"{high:.3f}]** (95% two-stage bootstrap). Machine: {load_average()}.\n\n" + "\n".join(rows)
    )
    print(table)
    record("The real model: overhead against GRPOTrainer, by phase", table)
    return table


# ------------------------------------------------------------------------------------------------------------- top-K


TOPK_CONFIGS = {
    "DPPO topk_tv (LM head in chunks)": ("DPPO", {"dppo_divergence": "topk_tv"}, True),
    "DPPO topk_tv (full-logits path)": ("DPPO", {"dppo_divergence": "topk_tv"}, False),
    "DPPO binary_tv": ("DPPO", {"dppo_divergence": "binary_tv"}, True),
    "DAPO (TRL's fused head)": ("DAPO", {"dynamic_sampling": False}, True),
}


def topk_worker(name: str, steps: int, length: int, num_threads: int | None = None) -> dict:
    from _common import make_rollout, measure_train, prompt_dataset, trainer_classes
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.models.tiny import cpu_config_kwargs

    use_free_cores(num_threads)
    trainer_name, overrides, from_hidden = TOPK_CONFIGS[name]
    config_class, trainer_class = trainer_classes(trainer_name)
    path = str(smollm2_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    settings = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=length,
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        seed=0,
    )
    trainer = trainer_class(
        model=path,
        reward_funcs=lambda completion_ids, **kwargs: [float(sum(ids) % 7) for ids in completion_ids],
        args=config_class(**{**cpu_config_kwargs(), **settings, **overrides}),
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
        rollout_func=make_rollout(tokenizer, length),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    if not from_hidden:
        trainer.topk_forward.lm_head_from_hidden = False  # the fallback: one [B, T, vocab] logits tensor
    return measure_train(trainer)


def topk_memory(options) -> str:
    results = {name: {"peak": [], "time": []} for name in TOPK_CONFIGS}
    for _ in range(options.repeats):
        for name in TOPK_CONFIGS:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                command = [sys.executable, __file__, "topk-worker", "--config", name, "--out", out]
                command += ["--steps", str(options.steps), "--length", str(options.length)]
                if options.num_threads is not None:
                    command += ["--num_threads", str(options.num_threads)]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise RuntimeError(f"{name} failed:\n{result.stderr[-4000:]}")
                measured = json.loads(Path(out).read_text())
            results[name]["peak"].append(measured["peak_mib"])
            results[name]["time"] += measured["step_times"]
    base = statistics.median(results["DPPO binary_tv"]["peak"])
    rows = ["| configuration | peak memory above start, MiB (median) | vs binary_tv | step time, s (median) |"]
    rows.append("|---|---:|---:|---:|")
    for name, r in results.items():
        peak = statistics.median(r["peak"])
        rows.append(f"| {name} | {peak:.0f} | {peak / base:.2f}x | {statistics.median(r['time']):.2f} |")
    logits_mib = 8 * options.length * 49152 * 4 / 2**20
    table = (
        f"SmolLM2-135M-Instruct (vocabulary 49,152) with LoRA r=16, 8 completions of {options.length} tokens per step "
        f"(a deterministic rollout, so every configuration trains on the same batch), {options.steps} steps, "
        f"{options.repeats} fresh processes per configuration, interleaved. One `[8, {options.length}, 49152]` float32 "
        f"logits tensor is {logits_mib:.0f} MiB. Machine: {load_average()}.\n\n" + "\n".join(rows)
    )
    print(table)
    record("The real model: DPPO top-K peak memory at vocabulary 49,152", table)
    return table


# ------------------------------------------------------------------------------------------------------------- dynamic sampling


def dynamic_sampling(options) -> str:
    from datasets import Dataset
    from dynamic_sampling import MODES, run
    from peft import LoraConfig

    from trl_reasoning.demo.run import REAL_MODEL_TRAINING
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.tasks.arithmetic import ArithmeticTask, last_number_reward

    use_free_cores(options.num_threads)
    path = str(smollm2_path())
    dataset = Dataset.from_list(ArithmeticTask().rl_rows("train"))
    overrides = {key: value for key, value in REAL_MODEL_TRAINING.items() if key not in ("log_level",)}
    overrides.update(max_num_gen_batches=4)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (dynamic, size) in MODES.items():
            lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
            results[name] = run(
                path, dynamic, size, options.steps, tmp, last_number_reward, dataset, overrides, peft_config=lora
            )
    rows = [
        "| dynamic sampling | rounds/step (median, max) | groups generated/step | groups training per step | "
        "generated tokens per training group | reward (last 5 steps) | cap hits | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        rows.append(
            f"| {name} | {r['rounds_median']:.1f}, {r['rounds_max']:.0f} | {r['generated_median']:.1f} | "
            f"{r['training_groups_median']:.1f} | {r['tokens_per_group_median']:.1f} | {r['reward_last5']:.3f} | "
            f"{r['cap_hits']:.0f} | {r['wall_s']:.0f} |"
        )
    table = (
        f"DAPO on SmolLM2-135M-Instruct with LoRA, the main job's task and settings (2 groups of 8 per step, at most "
        f"4 rounds), {options.steps} steps per mode, medians over steps. Machine: {load_average()}.\n\n"
        + "\n".join(rows)
    )
    print(table)
    record("The real model: dynamic sampling's generated tokens per trained group", table)
    return table


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("gain", help="the main job's held-out gain over seeds")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algorithm", default="dapo")
    p.add_argument("--rerun", action="store_true", help="run recorded seeds again")
    p.add_argument("demo_args", nargs=argparse.REMAINDER, help="more arguments for trl-reasoning demo")
    p = commands.add_parser("overhead", help="ours vs GRPOTrainer, by phase")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p = commands.add_parser("topk-memory", help="DPPO top-K peak memory at vocabulary 49,152")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--length", type=int, default=128)
    p = commands.add_parser("topk-worker")
    p.add_argument("--config")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--length", type=int, default=128)
    p = commands.add_parser("dynamic-sampling", help="generated tokens per trained group")
    p.add_argument("--steps", type=int, default=12)
    for command in commands.choices.values():
        command.add_argument(
            "--num_threads",
            type=int,
            default=None,
            help="torch threads (default: auto, torch's default less the cores other processes keep busy; 0: torch's "
            "default)",
        )
    options = parser.parse_args(argv)
    if options.command == "topk-worker":
        result = topk_worker(options.config, options.steps, options.length, options.num_threads)
        Path(options.out).write_text(json.dumps(result))
        return ""
    return {"gain": gain, "overhead": overhead, "topk-memory": topk_memory, "dynamic-sampling": dynamic_sampling}[
        options.command
    ](options)


import torch  # noqa: E402  (after the environment is set)

if __name__ == "__main__":
    main()
