"""The papers in miniature, v2: every preset, TRL's GRPOTrainer and TRL's RLOOTrainer on the chain-sum testbed, from
the same warm start, with the same budget of generated tokens, over several seeds.

The task (``trl_reasoning.tasks.chain_sums.ChainSumTask``, whose docstring says why it can separate the algorithms) has
completions whose length the policy controls, chains from 2 to 8 terms (the warm start solves long ones rarely) and a
sloppy teacher. Two regimes:

* ``on-policy``: TRL's defaults (one optimizer step per generation batch);
* ``stale``: each generation batch is split over 4 steps and replayed twice (``steps_per_generation=4``,
  ``num_iterations=2``), so the last update trains on rollouts 7 optimizer steps old: clip, CISPO and DPPO only.

Every run stops once it has generated ``--budget`` completion tokens (counted in the reward function, so dynamic
sampling's extra rounds count), with a constant learning rate so no run is favoured by a schedule. Held-out greedy
accuracy is measured along the way (the compute curve, fitted with ScaleRL's sigmoid per method); at the end, 16
samples per held-out prompt give pass@k, per chain length, and the lengths of correct and incorrect completions.

Each claim is tested as a difference of seed means between two methods with a 95 % bootstrap interval over seeds; the
verdict says whether the interval excludes zero, and in which direction. Claims that do not reproduce are reported as
such. Writes ``bench/testbed.png``, the raw runs in ``bench/testbed_runs.json`` and the tables in
``bench/RESULTS.md``.

    python bench/testbed.py [--seeds 5] [--budget 30000] [--jobs 2] [--from-json bench/testbed_runs.json] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import preset_methods, trainer_classes  # noqa: E402
from _results import record  # noqa: E402

#: method -> (trainer name for ``_common.trainer_classes``, config overrides). "TRL ..." rows are TRL's own trainers
#: with TRL's defaults; then every preset of ``trl_reasoning.presets.PRESETS`` with its defaults.
METHODS: dict[str, tuple[str, dict]] = {
    "TRL GRPO": ("trl.GRPO", {}),
    "TRL GRPO (loss_type=grpo)": ("trl.GRPO", {"loss_type": "grpo"}),
    "TRL RLOOTrainer": ("trl.RLOO", {}),
    **preset_methods(variants={"dapo": {"DAPO (no dynamic sampling)": ("DAPO", {"dynamic_sampling": False})}}),
}
REGIMES: dict[str, dict] = {"on-policy": {}, "stale": {"steps_per_generation": 4, "num_iterations": 2}}
#: The off-policy claim is about the policy loss under stale rollouts: clip (TRL's and DAPO's), CISPO, DPPO.
STALE_METHODS = ("TRL GRPO", "DAPO (no dynamic sampling)", "CISPO", "DPPO")
MAX_K = 16


class TokenMeter:
    """The task's reward, counting every generated completion token it scores (dynamic sampling's extra rounds
    included: each generated completion is scored once)."""

    __name__ = "chain_sum_reward"

    def __init__(self):
        self.tokens = 0

    def __call__(self, completions, answer, completion_ids=None, **kwargs):
        from trl_reasoning.tasks.chain_sums import chain_sum_reward

        if completion_ids is not None:
            self.tokens += sum(len(ids) for ids in completion_ids)
        else:  # a trainer that does not pass token ids: characters + EOS (the testbed's tokenizer is per character)
            self.tokens += sum(len(c[-1]["content"] if isinstance(c, list) else c) + 1 for c in completions)
        return chain_sum_reward(completions, answer)


def _evaluation_chunks(tokenizer, rows: list[dict], size: int = 32):
    """``(rows, prompt texts, answers)`` of consecutive chunks of ``rows``, for batched generation."""
    from trl_reasoning.evaluation.callbacks import _prompt_texts

    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        yield chunk, _prompt_texts(tokenizer, [r["prompt"] for r in chunk]), [r["answer"] for r in chunk]


def _generation(tokenizer, max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_k": 0, "pad_token_id": tokenizer.pad_token_id}


@contextlib.contextmanager
def _eval_mode(model):
    """``model.eval()`` for the block, then the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int) -> float:
    """Held-out greedy accuracy alone (the learning curve's points): no sampling, so no random numbers drawn."""
    from trl_reasoning.evaluation.callbacks import _sample
    from trl_reasoning.tasks.chain_sums import chain_sum_reward

    generation = _generation(tokenizer, max_new_tokens)
    greedy: list[float] = []
    with _eval_mode(model):
        for _, texts, answers in _evaluation_chunks(tokenizer, rows):
            greedy += chain_sum_reward(_sample(model, tokenizer, texts, 1, True, generation)["texts"], answers)
    return statistics.mean(greedy)


def final_evaluation(model, tokenizer, rows: list[dict], max_new_tokens: int, samples: int) -> dict:
    """Greedy accuracy, then ``samples`` sampled completions per prompt: pass@k for k = 1..samples overall, pass@1
    and pass@samples per chain length, mean length of correct and incorrect completions, scratchpad use."""
    from trl_reasoning.evaluation.callbacks import _sample
    from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k
    from trl_reasoning.tasks.chain_sums import chain_sum_reward

    greedy = greedy_accuracy(model, tokenizer, rows, max_new_tokens)  # draws no random numbers: sampling is unchanged
    generation = _generation(tokenizer, max_new_tokens)
    correct_counts, correct_lengths, incorrect_lengths, scratchpads = [], [], [], []
    with _eval_mode(model):
        for chunk, texts, answers in _evaluation_chunks(tokenizer, rows):
            sampled = _sample(model, tokenizer, texts, samples, False, generation)
            rewards = chain_sum_reward(sampled["texts"], [a for a in answers for _ in range(samples)])
            for i in range(len(chunk)):
                block = slice(i * samples, (i + 1) * samples)
                correct_counts.append(int(sum(rewards[block])))
                for reward, length, text in zip(rewards[block], sampled["lengths"][block], sampled["texts"][block]):
                    (correct_lengths if reward else incorrect_lengths).append(length)
                    scratchpads.append(not text.strip().startswith("="))
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    by_terms: dict[str, dict[str, float]] = {}
    for terms in sorted({r["num_terms"] for r in rows}):
        counts = [c for c, r in zip(correct_counts, rows) if r["num_terms"] == terms]
        by_terms[str(terms)] = {
            "pass@1": mean_pass_at_k(counts, samples, 1),
            f"pass@{samples}": mean_pass_at_k(counts, samples, samples),
        }
    longest = max(r["num_terms"] for r in rows)
    hard = [c for c, r in zip(correct_counts, rows) if r["num_terms"] >= longest - 1]  # the two longest chains
    return {
        "greedy_accuracy": greedy,
        "pass_at_k": [mean_pass_at_k(correct_counts, samples, k) for k in range(1, samples + 1)],
        "hard_pass_at_k": [mean_pass_at_k(hard, samples, k) for k in range(1, samples + 1)],
        "by_terms": by_terms,
        "correct_length": mean(correct_lengths),
        "incorrect_length": mean(incorrect_lengths),
        "scratchpad_rate": mean(scratchpads),
    }


def _run_settings(job: dict, key: str) -> dict:
    """The config values every method and regime share (the token budget, not ``max_steps``, ends a run)."""
    from trl_reasoning.models.tiny import cpu_config_kwargs

    return cpu_config_kwargs(
        output_dir=os.path.join(job["output_dir"], f"{key}-{job['regime']}-{job['seed']}"),
        per_device_train_batch_size=job["batch_size"],
        num_generations=8,
        max_completion_length=job["max_completion_length"],
        learning_rate=job["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=100_000,  # the token budget stops the run
        logging_steps=1,
        temperature=1.0,
        top_k=0,
        seed=job["seed"],
        log_level="error",
        dataloader_num_workers=0,
    )


def _run_result(job: dict, state, generated_tokens: int, points: list, seconds: float, final: dict) -> dict:
    """What a run reports: its training rewards (first and last five), steps, tokens, curve, time and final measures."""
    history = state.log_history
    rewards = [e["reward"] for e in history if "reward" in e]
    return {
        "train_reward_first": statistics.mean(rewards[:5]) if rewards else float("nan"),
        "train_reward_last": statistics.mean(rewards[-5:]) if rewards else float("nan"),
        "method": job["method"],
        "regime": job["regime"],
        "seed": job["seed"],
        "steps": state.global_step,
        "generated_tokens": generated_tokens,
        "points": points,
        "seconds": seconds,
        **final,
    }


def run_one(job: dict) -> dict:
    """One training run (``job``: method, regime, seed, budget, model_dir, task, eval settings); runs in a worker."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.tasks.chain_sums import ChainSumTask

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    task = ChainSumTask(**job["task"])
    key, overrides = METHODS[job["method"]]
    config_class, trainer_class = trainer_classes(key)
    settings = _run_settings(job, key)
    args = config_class(**{**settings, **REGIMES[job["regime"]], **overrides})
    tokenizer = load_tokenizer(job["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"])
    meter = TokenMeter()
    test_rows = task.rl_rows("test")
    curve_rows = test_rows[:: job["curve_stride"]]
    trainer = trainer_class(
        model=model,
        reward_funcs=meter,
        args=args,
        train_dataset=Dataset.from_list(task.rl_rows("train")),
        processing_class=tokenizer,
    )
    trainer.remove_callback(transformers.PrinterCallback)
    points: list[tuple[int, int, float]] = []

    def curve_point() -> float:
        return greedy_accuracy(trainer.model, tokenizer, curve_rows, args.max_completion_length)

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if meter.tokens >= job["budget"]:
                control.should_training_stop = True
            if control.should_training_stop or state.global_step % job["eval_every"] == 0:
                points.append((state.global_step, meter.tokens, curve_point()))

    trainer.add_callback(Budget())
    points.append((0, 0, curve_point()))
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    final = final_evaluation(trainer.model, tokenizer, test_rows, args.max_completion_length, job["samples"])
    return _run_result(job, trainer.state, meter.tokens, points, seconds, final)


# ----------------------------------------------------------------------------------------------- statistics


def bootstrap_difference(a: list[float], b: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, ...]:
    """mean(a) - mean(b) and its 95 % percentile-bootstrap interval (seeds resampled within each method)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a_values, b_values = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a_draws = rng.choice(a_values, size=(draws, len(a_values))).mean(axis=1)
    b_draws = rng.choice(b_values, size=(draws, len(b_values))).mean(axis=1)
    low, high = np.percentile(a_draws - b_draws, [2.5, 97.5])
    return float(a_values.mean() - b_values.mean()), float(low), float(high)


def verdict(difference: float, low: float, high: float, expected: str) -> str:
    """``expected``: "higher" (the claim says a > b), "lower" or "equal"."""
    if expected == "equal":
        return "reproduces (interval holds 0)" if low <= 0 <= high else "does not reproduce (interval excludes 0)"
    holds = low > 0 if expected == "higher" else high < 0
    opposite = high < 0 if expected == "higher" else low > 0
    if holds:
        return "reproduces"
    return "opposite (interval excludes 0)" if opposite else "not resolved (interval holds 0)"


def _runs(results: list[dict], method: str, regime: str) -> list[dict]:
    return [r for r in results if r["method"] == method and r["regime"] == regime]


def _values(results: list[dict], method: str, regime: str, measure) -> list[float]:
    return [measure(r) for r in _runs(results, method, regime)]


def _claims(k: int, warm: dict) -> list[tuple]:
    """The papers' claims the testbed checks: ``(text, (method A, regime), (method B, regime), measure, expected)``,
    with ``expected`` the sign of A - B the claim says ("higher", "lower" or "equal")."""
    length_growth = lambda r: r["incorrect_length"] - warm["incorrect_length"]  # noqa: E731
    return [
        (
            "DAPO: dynamic sampling learns more from the same generated tokens (held-out greedy accuracy)",
            ("DAPO", "on-policy"),
            ("DAPO (no dynamic sampling)", "on-policy"),
            lambda r: r["greedy_accuracy"],
            "higher",
        ),
        (
            f"MaxRL: higher pass@{k} than GRPO on the hard chains (the two longest lengths)",
            ("MaxRL", "on-policy"),
            ("TRL GRPO", "on-policy"),
            lambda r: r["hard_pass_at_k"][k - 1],
            "higher",
        ),
        (
            f"MaxRL: higher pass@{k} than GRPO over all held-out chains",
            ("MaxRL", "on-policy"),
            ("TRL GRPO", "on-policy"),
            lambda r: r["pass_at_k"][k - 1],
            "higher",
        ),
        (
            "Dr. GRPO: incorrect completions grow less than under GRPO's length-normalized loss (tokens, vs warm start)",
            ("Dr. GRPO", "on-policy"),
            ("TRL GRPO (loss_type=grpo)", "on-policy"),
            length_growth,
            "lower",
        ),
        (
            "CISPO: more held-out accuracy than clipping (TRL GRPO) with stale rollouts",
            ("CISPO", "stale"),
            ("TRL GRPO", "stale"),
            lambda r: r["greedy_accuracy"],
            "higher",
        ),
        (
            "DPPO: more held-out accuracy than clipping (TRL GRPO) with stale rollouts",
            ("DPPO", "stale"),
            ("TRL GRPO", "stale"),
            lambda r: r["greedy_accuracy"],
            "higher",
        ),
        (
            "RLOO preset = TRL's RLOOTrainer (same estimator; pass@1)",
            ("RLOO", "on-policy"),
            ("TRL RLOOTrainer", "on-policy"),
            lambda r: r["pass_at_k"][0],
            "equal",
        ),
    ]


def claims_table(results: list[dict], warm: dict) -> tuple[str, list[dict]]:
    k = MAX_K if all(len(r["pass_at_k"]) >= MAX_K for r in results) else len(results[0]["pass_at_k"])
    claims = _claims(k, warm)
    lines = [
        "| claim | A | B | mean A | mean B | effect A − B [95 % bootstrap CI] | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for text, (a, a_regime), (b, b_regime), measure, expected in claims:
        a_values = _values(results, a, a_regime, measure)
        b_values = _values(results, b, b_regime, measure)
        if not a_values or not b_values:
            continue
        difference, low, high = bootstrap_difference(a_values, b_values)
        outcome = verdict(difference, low, high, expected)
        rows.append({"claim": text, "effect": difference, "low": low, "high": high, "verdict": outcome})
        lines.append(
            f"| {text} | {a} ({a_regime}) | {b} ({b_regime}) | {statistics.mean(a_values):.3f} | "
            f"{statistics.mean(b_values):.3f} | {difference:+.3f} [{low:+.3f}, {high:+.3f}] | {outcome} |"
        )
    return "\n".join(lines), rows


def _median_ci(values: list[float]) -> str:
    import numpy as np

    rng = np.random.default_rng(0)
    draws = np.median(rng.choice(np.asarray(values, dtype=float), size=(10_000, len(values))), axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return f"{statistics.median(values):.3f} [{low:.2f}, {high:.2f}]"


def methods_table(results: list[dict], regime: str, warm: dict) -> str:
    from trl_reasoning.evaluation.compute_curves import fit_compute_curve

    k = len(results[0]["pass_at_k"])
    lines = [
        f"| method | greedy acc. | pass@1 | pass@{k} | hard pass@1 / pass@{k} | length correct / incorrect | "
        "scratchpad | steps | compute curve A ± se, B, C_mid (tokens), R² | RL s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| warm start | {warm['greedy_accuracy']:.3f} | {warm['pass_at_k'][0]:.3f} | {warm['pass_at_k'][-1]:.3f} | "
        f"{warm['hard_pass_at_k'][0]:.3f} / {warm['hard_pass_at_k'][-1]:.3f} | "
        f"{warm['correct_length']:.1f} / {warm['incorrect_length']:.1f} | {warm['scratchpad_rate']:.2f} | 0 | | |",
    ]
    for method in METHODS:
        runs = _runs(results, method, regime)
        if not runs:
            continue
        med = lambda f, runs=runs: statistics.median(f(r) for r in runs)  # noqa: E731
        try:
            points = [(tokens, accuracy) for r in runs for _, tokens, accuracy in r["points"] if tokens > 0]
            start = statistics.mean(accuracy for r in runs for _, tokens, accuracy in r["points"] if tokens == 0)
            fit = fit_compute_curve([p[0] for p in points], [p[1] for p in points], r0=start)
            fit_text = f"{fit.A:.3f} ± {fit.A_stderr:.3f}, {fit.B:.2f}, {fit.C_mid:.3g}, {fit.r_squared:.2f}"
        except (ValueError, FloatingPointError, OverflowError, RuntimeError) as error:
            fit_text = f"no fit ({type(error).__name__})"
        lines.append(
            f"| {method} | {_median_ci([r['greedy_accuracy'] for r in runs])} | "
            f"{_median_ci([r['pass_at_k'][0] for r in runs])} | {_median_ci([r['pass_at_k'][-1] for r in runs])} | "
            f"{med(lambda r: r['hard_pass_at_k'][0]):.3f} / {med(lambda r: r['hard_pass_at_k'][-1]):.3f} | "
            f"{med(lambda r: r['correct_length']):.1f} / {med(lambda r: r['incorrect_length']):.1f} | "
            f"{med(lambda r: r['scratchpad_rate']):.2f} | {med(lambda r: r['steps']):.0f} | {fit_text} | "
            f"{med(lambda r: r['seconds']):.0f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], warm: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    # One color per method in every panel (matplotlib's cycle restarts per axis and has 10 colors for 11 methods).
    palette = plt.get_cmap("tab20")
    colors = {method: palette((2 * index) % 20 + (2 * index) // 20) for index, method in enumerate(METHODS)}
    for axis, regime in zip(axes[:2], REGIMES):
        for method in METHODS:
            runs = _runs(results, method, regime)
            if not runs:
                continue
            points = sorted((tokens, accuracy) for r in runs for _, tokens, accuracy in r["points"])
            # a running median over seeds' points, ordered by tokens
            width = max(1, len(runs))
            xs = [statistics.mean(p[0] for p in points[i : i + width]) for i in range(0, len(points), width)]
            ys = [statistics.median(p[1] for p in points[i : i + width]) for i in range(0, len(points), width)]
            axis.plot(xs, ys, marker=".", label=method, color=colors[method])
        axis.set(title=f"held-out greedy accuracy, {regime}", xlabel="generated tokens", ylim=(-0.02, 1.02))
        axis.grid(alpha=0.3)
    ks = list(range(1, len(warm["pass_at_k"]) + 1))
    axes[2].plot(ks, warm["pass_at_k"], color="black", linestyle="--", label="warm start")
    for method in METHODS:
        runs = _runs(results, method, "on-policy")
        if runs:
            pass_at_k = [statistics.median(r["pass_at_k"][k - 1] for r in runs) for k in ks]
            axes[2].plot(ks, pass_at_k, label=method, color=colors[method])
    axes[2].set(title="pass@k after training (on-policy, median)", xlabel="k", xscale="log")
    axes[2].grid(alpha=0.3)
    for axis in axes:
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(results: list[dict], warm: dict, options) -> str:
    seeds = len({r["seed"] for r in results})
    header = (
        f"Chain-sum testbed (chains of {warm['task']['min_terms']}-{warm['task']['max_terms']} one-digit terms, "
        f"{len(warm['by_terms']) * warm['task']['num_test_per_length']} held-out prompts), one cached SFT warm start, "
        f"{seeds} seeds, a budget of {options.budget} generated completion tokens per run, constant lr "
        f"{options.learning_rate}, {options.batch_size} completions per step (8 per prompt). Medians over seeds "
        "with a 95 % bootstrap interval of the median; pass@k from 16 samples per held-out prompt; hard = the two "
        "longest chain lengths. The compute curve is fitted on greedy accuracy vs generated tokens "
        "(all seeds' points pooled)."
    )
    claims, _ = claims_table(results, warm)
    parts = [
        header,
        "",
        "**Claims** (effect = difference of seed means; A and B from the same warm start)",
        "",
        claims,
    ]
    for regime in REGIMES:
        if any(r["regime"] == regime for r in results):
            parts += [
                "",
                f"**{regime}** ({REGIMES[regime] or 'TRL defaults'})",
                "",
                methods_table(results, regime, warm),
            ]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------- driver


def _parse_options(argv: list[str] | None) -> argparse.Namespace:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=30_000, help="generated completion tokens per run")
    parser.add_argument("--batch-size", type=int, default=64, help="completions per optimizer step")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--eval-every", type=int, default=10, help="steps between held-out greedy evaluations")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    parser.add_argument("--test-per-length", type=int, default=40, help="held-out prompts per chain length")
    parser.add_argument("--methods", help="comma-separated subset of the methods")
    parser.add_argument("--from-json", help="summarize runs saved by an earlier invocation instead of training")
    parser.add_argument("--replot", action="store_true", help="with --from-json: redraw bench/testbed.png from them")
    parser.add_argument("--quick", action="store_true", help="1 seed, a tiny budget and warm start: checks it runs")
    return parser.parse_args(argv)


def _jobs(options, methods, max_completion_length, curve_stride, samples, model_dir, task: dict) -> list[dict]:
    """One job per seed, regime and method (the stale regime only for the methods meant for it)."""
    return [
        {
            "method": method,
            "regime": regime,
            "seed": seed,
            "budget": options.budget,
            "batch_size": options.batch_size,
            "learning_rate": options.learning_rate,
            "max_completion_length": max_completion_length,
            "eval_every": options.eval_every,
            "curve_stride": curve_stride,
            "samples": samples,
            "model_dir": str(model_dir),
            "task": task,
            "output_dir": "outputs/testbed",
        }
        for seed in range(options.seeds)
        for regime in REGIMES
        for method in methods
        if regime == "on-policy" or method in STALE_METHODS
    ]


def _run_jobs(jobs: list[dict], workers: int) -> list[dict]:
    """The results of ``jobs``, in this process or in ``workers`` fresh processes (one line printed per result)."""
    results = []
    if workers <= 1:
        results = [run_one(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for result in pool.map(run_one, jobs):
                results.append(result)
                print(
                    f"{result['method']} ({result['regime']}, seed {result['seed']}): greedy "
                    f"{result['greedy_accuracy']:.3f}, pass@1 {result['pass_at_k'][0]:.3f}, {result['steps']} steps, "
                    f"{result['seconds']:.0f} s",
                    flush=True,
                )
    return results


def _summarize_saved(options, here: Path) -> str:
    """The summary of the runs an earlier invocation saved (``--from-json``), redrawn with ``--replot``."""
    saved = json.loads(Path(options.from_json).read_text())
    options.budget, options.batch_size, options.learning_rate = (
        saved["options"][k] for k in ("budget", "batch_size", "learning_rate")
    )
    text = summarize(saved["runs"], saved["warm_start"], options)
    print(text)
    if options.replot:
        plot(saved["runs"], saved["warm_start"], here / "testbed.png")
    return text


def main(argv: list[str] | None = None) -> str:
    options = _parse_options(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    here = Path(__file__).parent
    if options.from_json:
        return _summarize_saved(options, here)

    import datasets
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from trl_reasoning.demo.warm_start import WarmStartSettings, warm_start
    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.tasks.chain_sums import ChainSumTask

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    if options.quick:
        task = ChainSumTask(min_terms=3, max_terms=4, num_train=256, num_test_per_length=4)
        settings = WarmStartSettings(max_steps=10)
        options.seeds, options.budget, options.batch_size, options.eval_every, options.jobs = 1, 200, 16, 1, 0
        samples, max_completion_length = 4, 16
    else:
        task = ChainSumTask(num_test_per_length=options.test_per_length)
        settings, samples, max_completion_length = WarmStartSettings(max_steps=600), MAX_K, 32
    model_dir, _ = warm_start(task, settings)
    tokenizer = load_tokenizer(model_dir)
    test_rows = task.rl_rows("test")
    torch.manual_seed(0)
    warm = final_evaluation(
        AutoModelForCausalLM.from_pretrained(model_dir), tokenizer, test_rows, max_completion_length, samples
    )
    curve_stride = 1 if options.quick else 2  # the curve's evaluations use every other held-out prompt
    warm["task"] = {key: value for key, value in task.to_dict().items() if key != "kind"}
    print(
        f"warm start: greedy {warm['greedy_accuracy']:.3f}, pass@1 {warm['pass_at_k'][0]:.3f}, "
        f"pass@{samples} {warm['pass_at_k'][-1]:.3f}, per length {warm['by_terms']}",
        flush=True,
    )
    methods = options.methods.split(",") if options.methods else list(METHODS)
    jobs = _jobs(options, methods, max_completion_length, curve_stride, samples, model_dir, warm["task"])
    results = _run_jobs(jobs, options.jobs)
    text = summarize(results, warm, options)
    print(text)
    if not options.quick:
        saved = {"options": vars(options), "warm_start": warm, "runs": results}
        (here / "testbed_runs.json").write_text(json.dumps(saved, indent=1) + "\n")
        plot(results, warm, here / "testbed.png")
        record("The papers in miniature, v2 (chain-sum testbed)", text + "\n\n![curves](testbed.png)")
    return text


if __name__ == "__main__":
    main()
