"""Tool use on the real model: SmolLM2-135M-Instruct learns to call a ``multiply`` tool, RL through TRL's own tool
loop (``tools=[multiply]`` given to ``DAPOTrainer`` as ``trl.GRPOTrainer`` takes it).

    python bench/tool_use.py [--seeds 0 1 2 3] [--rl_steps 8] [--num_threads 1] [--rerun | --summarize]

Three stages on the same held-out questions (``trl_reasoning.tasks.tool_use.ToolUseTask``, two- and three-digit
factors, none of whose factor pairs is trained on):

1. **base**: the untrained model, offered the tool (a small sample).
2. **warm start**: a short supervised warm start on tool-call transcripts (LoRA, merged; seed 0, cached on disk), short
   on purpose so that the model is only partly competent after it.
3. **RL**: DAPO from the warm-started model, once per seed (the seed drives sampling, LoRA init and data order), a
   fixed number of steps, then measured again. The held-out set is the same for every seed: the RL gain is paired by
   seed against the one warm-started model.

Measured each time (``tool_use.measure``, rollouts built exactly as TRL's loop builds them): tool-call rate (first turn
parsed into a call), well-formed-call rate (share of call attempts that are valid ``multiply`` calls with integer
arguments), right-factors rate, held-out accuracy sampled at temperature 1 (as RL samples) and greedy, pass@k. During
RL: TRL's ``tools/call_frequency`` and the reward per step. Each finished stage is kept in ``bench/tool_use_runs.json``
(a rerun resumes; ``--rerun`` redoes them; settings that differ from the recorded ones are refused). The markdown
table is printed; RESULTS.md is written by hand from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import t_interval, use_free_cores  # noqa: E402
from _results import load_average, read_runs, record, save_run  # noqa: E402

from trl_reasoning.tasks.tool_use import ToolUseTask, ToolWarmStart  # noqa: E402  (no torch or TRL import)

RUNS = Path(__file__).with_name("tool_use_runs.json")
#: The section of bench/RESULTS.md the table goes to.
SECTION = "The real model: learning to call a tool (SmolLM2-135M-Instruct, tool_multiply)"
#: The measurements of the table, in order, with their labels.
METRICS = {
    "tool_call_rate": "tool-call rate (sampled)",
    "well_formed_rate": "well-formed calls / call attempts",
    "right_factors_rate": "calls with the question's factors",
    "accuracy": "held-out accuracy, sampled (pass@1)",
    "greedy_accuracy": "held-out accuracy, greedy",
    "greedy_tool_call_rate": "tool-call rate (greedy)",
    "pass@4": "pass@4",
    "pass@8": "pass@8",
}


def settings(options) -> dict:
    """Everything that determines the results (the recorded runs must share it)."""
    return {
        "task": ToolUseTask().to_dict(),
        "warm_start": {
            **ToolWarmStart().__dict__,
            "max_steps": options.warm_steps,
            "learning_rate": options.warm_lr,
        },
        "rl": {
            "trainer": "DAPOTrainer",
            "steps": options.rl_steps,
            "prompts_per_step": options.prompts_per_step,
            "num_generations": options.num_generations,
            "learning_rate": options.rl_lr,
            "lora_rank": 16,
            "max_completion_length": options.max_completion_length,
            "max_tool_calling_iterations": 2,
            "dynamic_sampling": False,
            "overlong_cache_length": None,
        },
        "measure": {
            "num_prompts": options.num_prompts,
            "num_samples": options.num_samples,
            "base_samples": options.base_samples,
            "base_prompts": options.base_prompts,
        },
    }


def _check_settings(options) -> None:
    wanted = settings(options)
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    recorded = read_runs(RUNS).get("settings")
    if options.rerun or recorded is None:
        if options.rerun and RUNS.exists():
            RUNS.unlink()
        save_run(RUNS, "settings", {**wanted, "hash": digest})
        return
    if recorded.get("hash") != digest:
        raise SystemExit(
            f"{RUNS.name} holds runs made with other settings (hash {recorded.get('hash')}, these {digest}); pass "
            "--rerun to start over."
        )


def _measure(model, tokenizer, options, num_samples: int, num_prompts: int) -> dict:
    """The held-out measurements: ``num_samples`` completions per question at temperature 1 (as RL samples them)
    summarized by ``tool_use.summarize``, pass@k with the package's estimator, and one greedy completion per question
    (``greedy_accuracy``, ``greedy_tool_call_rate``); also the mean number of the model's own tokens per completion and
    a few completions as text."""
    import torch

    from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k
    from trl_reasoning.tasks.tool_use_measures import rollouts, summarize

    task = ToolUseTask()
    questions = task.questions()[1][:num_prompts]
    prompts = [task.messages(q) for q, _, _ in questions]
    answers, factors = [a * b for _, a, b in questions], [(a, b) for _, a, b in questions]
    settings = {"max_completion_length": options.max_completion_length, "max_tool_calling_iterations": 2}
    torch.manual_seed(0)
    sampled = rollouts(model, tokenizer, prompts, num_samples=num_samples, **settings)
    out = summarize([[r.completion for r in group] for group in sampled], answers, factors)
    for k in (1, 4, 8):
        if k <= num_samples:
            out[f"pass@{k}"] = mean_pass_at_k(out["correct_counts"], num_samples, k)
    out["mean_model_tokens"] = statistics.fmean(sum(r.tool_mask) for group in sampled for r in group)
    greedy = rollouts(model, tokenizer, prompts, greedy=True, **settings)
    greedy_summary = summarize([[group[0].completion] for group in greedy], answers)
    out.update(greedy_accuracy=greedy_summary["accuracy"], greedy_tool_call_rate=greedy_summary["tool_call_rate"])
    out["examples"] = [tokenizer.decode(group[0].completion_ids) for group in sampled[:3]]
    return out


def _print_stage(key: str, result: dict) -> None:
    shown = ", ".join(f"{name} {result[name]:.3f}" for name in METRICS if name in result)
    print(f"{key}: {shown} ({result['wall_s']:.0f} s)", flush=True)
    for example in result.get("examples", [])[:2]:
        print(f"    e.g. {example!r}", flush=True)


def base_stage(options) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.tasks.tool_use import tool_tokenizer

    started = time.time()
    path = str(smollm2_path())
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = tool_tokenizer(AutoTokenizer.from_pretrained(path))
    result = _measure(model, tokenizer, options, options.base_samples, options.base_prompts)
    result.update(wall_s=time.time() - started, load=load_average())
    save_run(RUNS, "base", result)
    _print_stage("base", result)


def _warm_start_folder(options) -> tuple[Path, bool, float]:
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.tasks.tool_use import warm_start

    started = time.time()
    warm = ToolWarmStart(max_steps=options.warm_steps, learning_rate=options.warm_lr)
    folder, cached = warm_start(smollm2_path(), ToolUseTask(), warm)
    return folder, cached, time.time() - started


def warm_stage(options) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_reasoning.tasks.tool_use import tool_tokenizer

    folder, cached, train_s = _warm_start_folder(options)
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tokenizer = tool_tokenizer(AutoTokenizer.from_pretrained(str(folder)))
    result = _measure(model, tokenizer, options, options.num_samples, options.num_prompts)
    record = json.loads((folder / "warm_start.json").read_text())
    result.update(
        wall_s=time.time() - started,
        warm_start_s=None if cached else train_s,
        warm_start_losses=record["losses"],
        load=load_average(),
    )
    save_run(RUNS, "warm_start", result)
    _print_stage("warm_start", result)


def rl_stage(options, seed: int) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_reasoning import DAPOConfig, DAPOTrainer
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.tool_use import TOOLS, tool_answer_reward, tool_tokenizer

    folder, _, _ = _warm_start_folder(options)
    task = ToolUseTask()
    started = time.time()
    with tempfile.TemporaryDirectory() as output_dir:
        args = DAPOConfig(
            **cpu_config_kwargs(
                output_dir=output_dir,
                per_device_train_batch_size=options.prompts_per_step * options.num_generations,
                num_generations=options.num_generations,
                max_completion_length=options.max_completion_length,
                max_tool_calling_iterations=2,
                learning_rate=options.rl_lr,
                max_steps=options.rl_steps,
                logging_steps=1,
                temperature=1.0,
                top_k=0,
                seed=seed,
                dynamic_sampling=False,  # a fixed cost per step (a rerolled group is a whole extra generation)
                overlong_cache_length=None,  # a call and its tool response fill most of the budget by design
                log_level="warning",
                dataloader_num_workers=0,
            )
        )
        trainer = DAPOTrainer(
            model=str(folder),
            reward_funcs=tool_answer_reward,
            args=args,
            train_dataset=Dataset.from_list(task.rl_rows("train")),
            processing_class=tool_tokenizer(AutoTokenizer.from_pretrained(str(folder))),
            tools=list(TOOLS),
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        trainer.train()
        train_s = time.time() - started
        history = trainer.state.log_history
        measured_at = time.time()
        result = _measure(trainer.model, trainer.processing_class, options, options.num_samples, options.num_prompts)
    result.update(wall_s=time.time() - started, rl_s=train_s, measure_s=time.time() - measured_at, load=load_average())
    result.update(_logged(history, call_frequency="tools/call_frequency", failure_frequency="tools/failure_frequency"))
    result.update(_logged(history, reward="reward", step_time="step_time"))
    save_run(RUNS, f"rl/{seed}", result)
    _print_stage(f"rl/{seed}", result)
    print(
        f"    tools/call_frequency by step {[round(v, 2) for v in result['call_frequency']]}, reward "
        f"{[round(v, 2) for v in result['reward']]}",
        flush=True,
    )


def _logged(history: list[dict], **keys: str) -> dict[str, list[float]]:
    """``{name: every logged value of its metric}`` for each ``name=metric`` of ``keys``."""
    return {name: [entry[metric] for entry in history if metric in entry] for name, metric in keys.items()}


def _fmt(value: float, scale: float = 100.0) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{scale * value:.1f}"


def table(options) -> str:
    runs = read_runs(RUNS)
    base, warm = runs.get("base"), runs.get("warm_start")
    seeds = sorted(int(key.split("/")[1]) for key in runs if key.startswith("rl/"))
    rl = [runs[f"rl/{seed}"] for seed in seeds]
    header = "| metric (%) | base | warm start | " + " | ".join(f"RL seed {s}" for s in seeds)
    header += " | RL mean ± sd | RL − warm start, mean [95% t] |"
    rows = [header, "|---|" + "---:|" * (4 + len(seeds))]
    for name, label in METRICS.items():
        if warm is None or name not in warm:
            continue
        values = [run.get(name) for run in rl]
        finite = [v for v in values if v is not None and not math.isnan(v)]
        spread = (
            f"{_fmt(statistics.fmean(finite))} ± {_fmt(statistics.stdev(finite)) if len(finite) > 1 else '–'}"
            if finite
            else "–"
        )
        gain = "–"
        if len(finite) == len(values) and values and not math.isnan(warm[name]):
            mean, low, high = t_interval([100 * (v - warm[name]) for v in values])
            gain = f"{mean:+.1f}" + (f" [{low:+.1f}, {high:+.1f}]" if len(values) > 1 else "")
        cells = [_fmt(base.get(name) if base else None), _fmt(warm[name]), *[_fmt(v) for v in values]]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {spread} | {gain} |")
    if rl:
        freq = [
            f"{statistics.fmean(r['call_frequency'][:3]):.2f} → {statistics.fmean(r['call_frequency'][-3:]):.2f}"
            for r in rl
        ]
        rows.append("| TRL tools/call_frequency, first 3 → last 3 steps | | | " + " | ".join(freq) + " | | |")
        reward = [f"{statistics.fmean(r['reward'][:3]):.2f} → {statistics.fmean(r['reward'][-3:]):.2f}" for r in rl]
        rows.append("| training reward, first 3 → last 3 steps | | | " + " | ".join(reward) + " | | |")
        walls = [f"{r['rl_s']:.0f} + {r['measure_s']:.0f}" for r in rl]
        first = [f"{stage['wall_s']:.0f}" if stage else "–" for stage in (base, warm)]
        rows.append("| wall s (RL + measuring) | " + " | ".join(first + walls) + " | | |")
    s = settings(options)
    details = (
        f"SmolLM2-135M-Instruct with a `multiply` tool (TRL's `qwen2_5_chat_template`, TRL's tool loop), "
        f"{options.num_prompts} held-out questions (two- and three-digit factors) x {options.num_samples} samples at "
        f"temperature 1 plus one greedy (base: {options.base_prompts} x {options.base_samples}). Warm start: "
        f"{s['warm_start']['max_steps']} steps x {s['warm_start']['batch_size']} transcripts, LoRA r="
        f"{s['warm_start']['lora_rank']}, lr {s['warm_start']['learning_rate']}, merged. RL: DAPO (dynamic sampling "
        f"and overlong shaping off), LoRA r=16, lr {options.rl_lr}, {options.rl_steps} steps x "
        f"{options.prompts_per_step} prompts x {options.num_generations} completions, max_completion_length "
        f"{options.max_completion_length} (tool tokens included), max_tool_calling_iterations 2, reward = correct "
        f"final number only. Seeds {seeds}. Machine: {rl[-1]['load'] if rl else load_average()} during the last run."
    )
    text = details + "\n\n" + "\n".join(rows)
    print(text)
    return text


def main(argv: list[str] | None = None) -> str:
    global RUNS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--rl_steps", type=int, default=8)
    parser.add_argument("--rl_lr", type=float, default=1e-3)
    parser.add_argument("--prompts_per_step", type=int, default=2)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_completion_length", type=int, default=96)
    parser.add_argument("--warm_steps", type=int, default=ToolWarmStart.max_steps)
    parser.add_argument("--warm_lr", type=float, default=ToolWarmStart.learning_rate)
    parser.add_argument("--num_prompts", type=int, default=24, help="held-out questions (of the task's 32)")
    parser.add_argument("--num_samples", type=int, default=4, help="sampled completions per held-out question")
    parser.add_argument("--base_prompts", type=int, default=16)
    parser.add_argument("--base_samples", type=int, default=2)
    parser.add_argument("--stages", nargs="+", default=["base", "warm", "rl"], choices=["base", "warm", "rl"])
    parser.add_argument("--runs", type=Path, default=RUNS, help="the runs file (default: bench/tool_use_runs.json)")
    parser.add_argument("--rerun", action="store_true", help="discard the recorded runs and start over")
    parser.add_argument("--summarize", action="store_true", help="only print the table of the recorded runs")
    parser.add_argument(
        "--num_threads", type=int, default=None, help="torch threads (default: auto, the cores other processes leave)"
    )
    options = parser.parse_args(argv)
    RUNS = options.runs
    if options.summarize:
        return _recorded(table(options))
    _check_settings(options)
    # The trainers, imported before the first stage: a run is an hour, and a package half-edited by then (a shared
    # checkout) must not stop it at its RL stage.
    from trl_reasoning import DAPOConfig, DAPOTrainer  # noqa: F401

    stages = [("base", base_stage, ())] if "base" in options.stages else []
    stages += [("warm_start", warm_stage, ())] if "warm" in options.stages else []
    stages += [(f"rl/{seed}", rl_stage, (seed,)) for seed in options.seeds if "rl" in options.stages]
    for key, run, arguments in stages:
        if key in read_runs(RUNS):
            print(f"{key}: recorded, skipped", flush=True)
            continue
        threads = use_free_cores(options.num_threads)
        print(f"{key}: {threads} torch thread(s), {load_average()}", flush=True)
        run(options, *arguments)
    return _recorded(table(options))


def _recorded(text: str) -> str:
    """The table, also written to its section of bench/RESULTS.md."""
    record(SECTION, text)
    return text


if __name__ == "__main__":
    main()
