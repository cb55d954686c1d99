"""Evidence v3: the papers' claims where a real model can answer differently from the toy, on SmolLM2-135M-Instruct.

Every run starts from the model itself (LoRA r=16 on all linear layers, learning rate 2e-4, constant), trains on one-step
arithmetic (``demo.arithmetic``: addition, subtraction and multiplication questions, a held-out set of 64 never seen
in training) and stops at the same budget of generated completion tokens (counted in the reward function, so dynamic
sampling's extra rounds count). The held-out set is then measured once per run: greedy accuracy, 8 samples per
question (pass@1, pass@8, the length of correct and incorrect completions).

Method (from re-reading v2): each claim compares two arms that differ in **one** setting, everything else equal
(estimator, aggregation, sampling, learning rate, budget); runs are paired by seed (the same seed gives both arms the
same first batch) and the effect is the mean of the per-seed differences with a 95% Student-t interval (a percentile
bootstrap over a handful of seeds under-covers). A direction is called only when the interval excludes 0, and a small
effect only at >= 8 seeds; anything else is reported as not resolved.

Claims (arm A vs arm B; the measure; what the paper expects):

* ``maxrl_passk``: estimator ``maxrl`` vs ``grpo`` (clip 0.2, token mean, binary reward); held-out pass@8; MaxRL
  expects higher pass@k.
* ``stale_cispo`` / ``stale_dppo``: policy loss ``cispo`` (cap 5) / ``dppo`` (binary TV 0.15) vs ``clip`` (0.2/0.28),
  estimator ``grpo``, token mean, in the papers' off-policy regime: each sample used once (``num_iterations=1``), each
  generation batch split over 4 optimizer steps (``steps_per_generation=4``), so the last step trains on rollouts 3
  updates old; held-out pass@1, with each run's clip fraction (the share of tokens a clip, cap or mask acts on);
  CISPO and DPPO expect to do better than clipping.
* ``dynamic_sampling``: DAPO with dynamic sampling on vs off; held-out pass@1 at the same generated-token budget; DAPO
  expects more accuracy per generated token.
* ``length_bias``: aggregation ``seq_mean_token_mean`` (GRPO's 1/|y|) vs ``seq_mean_token_sum_norm`` (Dr. GRPO),
  estimator ``dr_grpo`` both; the length of incorrect held-out completions (``max_completion_length=32`` leaves room);
  Dr. GRPO expects them longer under 1/|y|.

Runs take minutes each on a CPU; every finished run is appended to ``bench/evidence_real_runs.json`` at once, and a
later invocation skips the runs already there, so the table fills across sessions:

    python bench/evidence_real.py --claims maxrl_passk stale_cispo --seeds 0 1 2 [--jobs 2] [--budget 4000]
    python bench/evidence_real.py --summarize      # the table and bench/evidence_real.png from the recorded runs
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import t_interval  # noqa: E402
from _results import record  # noqa: E402

RUNS = Path(__file__).with_name("evidence_real_runs.json")
TEST_QUESTIONS = 64
PLOT = Path(__file__).with_name("evidence_real.png")

_BASE = {"advantage_estimator": "grpo", "loss_aggregation": "token_mean", "dynamic_sampling": False}
_CLIP = {"policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.28}
_STALE = {"steps_per_generation": 4, "num_iterations": 1}
#: claim -> (arm A, arm B, measure, the direction the paper expects for A - B, extra settings of both arms)
CLAIMS: dict[str, dict] = {
    "maxrl_passk": {
        "arms": {
            "maxrl": {**_BASE, **_CLIP, "advantage_estimator": "maxrl"},
            "grpo": {**_BASE, **_CLIP},
        },
        "measure": "pass@8",
        "expects": "higher",
    },
    "stale_cispo": {
        "arms": {
            "cispo": {**_BASE, "policy_loss": "cispo", "epsilon_high": 5.0, **_STALE},
            "clip": {**_BASE, **_CLIP, **_STALE},
        },
        "measure": "pass@1",
        "expects": "higher",
    },
    "stale_dppo": {
        "arms": {
            "dppo": {**_BASE, "policy_loss": "dppo", "dppo_divergence": "binary_tv", **_STALE},
            "clip": {**_BASE, **_CLIP, **_STALE},
        },
        "measure": "pass@1",
        "expects": "higher",
    },
    "dynamic_sampling": {
        "arms": {
            "on": {**_BASE, **_CLIP, "dynamic_sampling": True, "max_num_gen_batches": 4},
            "off": {**_BASE, **_CLIP},
        },
        "measure": "pass@1",
        "expects": "higher",
    },
    "length_bias": {
        "arms": {
            "seq_mean_token_mean": {
                **_BASE,
                **_CLIP,
                "advantage_estimator": "dr_grpo",
                "loss_aggregation": "seq_mean_token_mean",
                "max_completion_length": 32,
            },
            "seq_mean_token_sum_norm": {
                **_BASE,
                **_CLIP,
                "advantage_estimator": "dr_grpo",
                "loss_aggregation": "seq_mean_token_sum_norm",
                "max_completion_length": 32,
            },
        },
        "measure": "incorrect_length",
        "expects": "higher",
    },
}


def _runs() -> dict:
    return json.loads(RUNS.read_text()) if RUNS.exists() else {}


def _key(claim: str, arm: str, seed: int, budget: int) -> str:
    return f"{claim}/{arm}/{seed}/{budget}"


def _run_settings(job: dict, cpu_settings: dict) -> dict:
    """The config values every arm shares (the real model's measured CPU settings; the token budget, not
    ``max_steps``, ends a run), before the arm's own."""
    settings = {
        **cpu_settings,
        "output_dir": job["output_dir"],
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 16,
        "learning_rate": 2e-4,
        "lr_scheduler_type": "constant",
        "max_steps": 10_000,  # the token budget stops the run
        "logging_steps": 1,
        "temperature": 1.0,
        "top_k": 0,
        "seed": job["seed"],
        "log_level": "error",
    }
    return settings


def _clipped_fractions(job: dict, history: list[dict]) -> list[float]:
    """Per logged step, the fraction of tokens the arm's objective clips or masks (DPPO's masked fractions, both
    signs, in the stale-DPPO claim)."""
    clipped = [
        entry.get("clip_ratio/region_mean", entry.get("clip_ratio/high_mean", entry.get("dppo/masked_frac_pos_adv")))
        for entry in history
    ]
    clipped = [c for c in clipped if c is not None]
    if job["claim"] == "stale_dppo" and job["arm"] == "dppo":
        clipped = [e.get("dppo/masked_frac_pos_adv", 0.0) + e.get("dppo/masked_frac_neg_adv", 0.0) for e in history]
    return clipped


def _trainer_within_budget(job: dict, args, path, tokenizer, task, reward, tokens: dict):
    """The LoRA trainer of one run, stopped at the step where the generated tokens reach ``job["budget"]``."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trl_reasoning import ReasoningTrainer

    trainer = ReasoningTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(task.rl_rows("train")),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(transformers.PrinterCallback)

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if tokens["generated"] >= job["budget"]:
                control.should_training_stop = True

    trainer.add_callback(Budget())
    return trainer


def run_one(job: dict) -> dict:
    """One training run and its held-out measurement (in a fresh process, see ``main``'s ``--worker``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers

    from trl_reasoning import ReasoningConfig
    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.arithmetic import ArithmeticTask, last_number, last_number_reward

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    path = smollm2_path()
    task = ArithmeticTask(kinds=("add", "sub", "mul"), num_train=2048, num_test=TEST_QUESTIONS, seed=0)
    tokens = {"generated": 0}

    def reward(completions, answer, completion_ids=None, **kwargs):
        tokens["generated"] += sum(len(ids) for ids in completion_ids)
        return last_number_reward(completions, answer)

    reward.__name__ = "last_number_reward"
    settings = _run_settings(job, cpu_config_kwargs())
    settings.update(CLAIMS[job["claim"]]["arms"][job["arm"]])
    args = ReasoningConfig(**settings)
    tokenizer = load_tokenizer(path)
    trainer = _trainer_within_budget(job, args, path, tokenizer, task, reward, tokens)
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    measures = held_out_measures(
        trainer.model, tokenizer, task.rl_rows("test"), args.max_completion_length, last_number
    )
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    clipped = _clipped_fractions(job, history)
    rewards = [entry["reward"] for entry in history if "reward" in entry]
    return {
        **job,
        "steps": trainer.state.global_step,
        "generated_tokens": tokens["generated"],
        "train_seconds": train_seconds,
        **measures,
        "clip_fraction": statistics.fmean(clipped) if clipped else float("nan"),
        # the reward is logged at generation steps only (every steps_per_generation steps in the stale regime)
        "train_reward_last": statistics.fmean(rewards[-5:]) if rewards else float("nan"),
        "load": os.getloadavg()[0],
    }


def held_out_measures(model, tokenizer, rows: list[dict], max_new_tokens: int, last_number, samples: int = 8) -> dict:
    """One greedy reply and ``samples`` sampled replies (temperature 1, a fixed seed) per held-out question: greedy
    accuracy, unbiased pass@1 and pass@``samples``, and the mean length (tokens, EOS included) of all, correct and
    incorrect sampled replies."""
    import torch

    from trl_reasoning.evaluation.callbacks import _prompt_texts, _sample
    from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k

    generation = {
        "max_new_tokens": max_new_tokens,
        "temperature": 1.0,
        "top_k": 0,
        "pad_token_id": tokenizer.pad_token_id,
    }
    greedy, counts, correct, incorrect = [], [], [], []
    torch.manual_seed(1234)
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(rows), 8):
            chunk = rows[start : start + 8]
            texts = _prompt_texts(tokenizer, [r["prompt"] for r in chunk])
            answers = [r["answer"] for r in chunk]
            greedy += [
                last_number(t) == a
                for t, a in zip(_sample(model, tokenizer, texts, 1, True, generation)["texts"], answers)
            ]
            sampled = _sample(model, tokenizer, texts, samples, False, generation)
            for index, answer in enumerate(answers):
                block = slice(index * samples, (index + 1) * samples)
                right = [last_number(t) == answer for t in sampled["texts"][block]]
                counts.append(sum(right))
                for ok, length in zip(right, sampled["lengths"][block], strict=True):
                    (correct if ok else incorrect).append(length)
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    mean = lambda values: statistics.fmean(values) if values else float("nan")  # noqa: E731
    return {
        "accuracy": mean([float(g) for g in greedy]),
        "pass@1": mean_pass_at_k(counts, samples, 1),
        f"pass@{samples}": mean_pass_at_k(counts, samples, samples),
        "mean_length": mean(correct + incorrect),
        "correct_length": mean(correct),
        "incorrect_length": mean(incorrect),
    }


def _launch(job: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job = {**job, "output_dir": os.path.join(tmp, "run")}
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, __file__, "--worker", json.dumps(job), "--out", out]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{job} failed:\n{result.stderr[-4000:]}")
        return json.loads(Path(out).read_text())


def collect(options) -> None:
    jobs = []
    recorded = _runs()
    for seed in options.seeds:
        for claim in options.claims:
            for arm in CLAIMS[claim]["arms"]:
                key = _key(claim, arm, seed, options.budget)
                if key not in recorded:
                    jobs.append({"claim": claim, "arm": arm, "seed": seed, "budget": options.budget, "key": key})
    print(f"{len(jobs)} runs to do ({len(recorded)} recorded)", flush=True)

    def go(job: dict) -> None:
        started = time.time()
        result = _launch(job)
        result["wall_s"] = time.time() - started
        runs = _runs()  # re-read: another worker may have written meanwhile
        runs[job["key"]] = result
        RUNS.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
        print(
            f"{job['key']}: {CLAIMS[job['claim']]['measure']} {result[CLAIMS[job['claim']]['measure']]:.3f} "
            f"({result['steps']} steps, {result['wall_s']:.0f} s)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        for future in [pool.submit(go, job) for job in jobs]:
            future.result()


def summarize(options) -> str:
    runs = _runs()
    rows = [
        "| claim | arm A − arm B | measure | A (mean) | B (mean) | A − B, mean [95% t] | seeds | clip fraction A / B | "
        "steps A / B | verdict |",
        "|---|---|---|---:|---:|---|---:|---|---|---|",
    ]
    effects = []
    for claim, spec in CLAIMS.items():
        arm_a, arm_b = list(spec["arms"])
        measure = spec["measure"]
        by_seed: dict[int, dict[str, dict]] = {}
        for run in runs.values():
            if run["claim"] == claim and run["budget"] == options.budget:
                by_seed.setdefault(run["seed"], {})[run["arm"]] = run
        paired = [(r[arm_a], r[arm_b]) for r in by_seed.values() if arm_a in r and arm_b in r]
        if not paired:
            continue
        differences = [a[measure] - b[measure] for a, b in paired]
        mean, low, high = t_interval(differences)
        if len(paired) < 3 or not (low > 0 or high < 0):
            verdict = "not resolved" + (" (fewer than 3 seeds)" if len(paired) < 3 else "")
        else:
            direction = "higher" if low > 0 else "lower"
            agrees = direction == spec["expects"]
            verdict = ("reproduces" if agrees else "opposite") + (
                "" if len(paired) >= 8 else f" at {len(paired)} seeds (a small effect needs >= 8)"
            )
        effects.append((claim, mean, low, high))
        fmean = statistics.fmean
        rows.append(
            f"| {claim} | {arm_a} − {arm_b} | {measure} | {fmean(a[measure] for a, _ in paired):.3f} | "
            f"{fmean(b[measure] for _, b in paired):.3f} | {mean:+.3f} [{low:+.3f}, {high:+.3f}] | {len(paired)} | "
            f"{fmean(a['clip_fraction'] for a, _ in paired):.4f} / {fmean(b['clip_fraction'] for _, b in paired):.4f} | "
            f"{fmean(a['steps'] for a, _ in paired):.0f} / {fmean(b['steps'] for _, b in paired):.0f} | {verdict} |"
        )
    loads = [run.get("load", float("nan")) for run in runs.values()]
    table = (
        f"SmolLM2-135M-Instruct, LoRA r=16, lr 2e-4 constant, one-step add/sub/mul, {options.budget} generated completion "
        f"tokens per run, held-out set of 64 questions x 8 samples; arms paired by seed, 95% Student-t interval of the "
        f"per-seed differences. Machine load (1-min average at the end of each run): median "
        f"{statistics.median(loads):.1f} on 2 cores.\n\n" + "\n".join(rows)
    )
    print(table)
    _plot(effects)
    record("The real model: evidence v3 (claims, paired by seed)", table)
    return table


def _plot(effects) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not effects:
        return
    fig, axis = plt.subplots(figsize=(7, 0.6 + 0.5 * len(effects)))
    for row, (_claim, mean, low, high) in enumerate(effects):
        axis.errorbar(mean, row, xerr=[[mean - low], [high - mean]], fmt="o", capsize=4, color="tab:blue")
    axis.axvline(0, color="grey", lw=1)
    axis.set_yticks(range(len(effects)), [claim for claim, *_ in effects])
    axis.set_xlabel("arm A − arm B (mean over seeds, 95% t interval)")
    axis.set_title("Evidence v3 on SmolLM2-135M-Instruct")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", nargs="+", default=list(CLAIMS), choices=list(CLAIMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=4000, help="generated completion tokens per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one torch thread each)")
    parser.add_argument("--summarize", action="store_true", help="only the table and the plot, from the recorded runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        Path(options.out).write_text(json.dumps(run_one(json.loads(options.worker))))
        return ""
    if not options.summarize:
        collect(options)
    return summarize(options)


if __name__ == "__main__":
    main()
