"""The synchronous vLLM path on the real model: our DAPO against ``GRPOTrainer(loss_type="dapo", epsilon_high=0.28)``.

    python bench/off_policy.py --seeds 0 1 2 --steps 4 --warmup 1 --num_threads 2

vLLM cannot run here (no CUDA), so TRL's ``VLLMGeneration`` is replaced by an engine stand-in that answers at once,
as an engine on its own device would from the trainer's point of view: each completion is ``--length`` token ids
derived from a hash of its prompt and index, with the sampler's log-probabilities supplied (a fixed value per token),
and TRL's importance-sampling correction on (``token_truncate``: the stand-in's log-probs are not the model's, and
a truncated ratio keeps every gradient non-zero where a masked one would zero most). Both trainers then do exactly the training-side work
of a synchronous vLLM step: TRL's scoring (the no-grad forward for ``pi_old``, which ours skips where it is exact),
rewards, the loss's forward and backward, the optimizer. The engine's own sampling time is not in these figures.

Arms, each a fresh process per seed, interleaved within a seed so that the machine's load hits every arm alike:

- ``trl``: TRL's ``GRPOTrainer`` with ``loss_type="dapo"``, ``epsilon_high=0.28``;
- ``ours``: ``DAPOTrainer`` (dynamic sampling off: one generation round a step, as TRL);
- ``ours-trl-forward``: ``DAPOTrainer`` with ``pi_old`` from TRL's extra forward (the one switch back).

SmolLM2-135M-Instruct with LoRA r=16, 16 completions a step. Seconds per optimizer step after ``--warmup`` steps; the
ratio of step times to ``trl`` paired by seed (geometric mean, 95% t interval). Recorded in ``bench/RESULTS.md``; the
runs in ``bench/off_policy_runs.json``.
"""

from __future__ import annotations

import argparse
import hashlib
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

from _common import geometric_t_interval, require_recorded_runs, use_free_cores  # noqa: E402
from _results import read_runs, record, save_run  # noqa: E402

RUNS = Path(__file__).with_name("off_policy_runs.json")
ARMS = ("trl", "ours", "ours-trl-forward")
#: The config field that takes pi_old from TRL's own forward again (``ours-trl-forward``).
TRL_FORWARD_SWITCH: dict[str, object] = {"importance_sampling_pi_old_from_loss": False}


def _hash_tokens(text: str, index: int, length: int, vocab: int, avoid: set[int]) -> list[int]:
    tokens, counter = [], 0
    while len(tokens) < length:
        digest = hashlib.sha256(f"{text}|{index}|{counter}".encode()).digest()
        counter += 1
        token = int.from_bytes(digest[:4], "little") % vocab
        if token not in avoid:
            tokens.append(token)
    return tokens


class InstantEngine:
    """Stand-in for ``trl.generation.vllm_generation.VLLMGeneration`` (colocate mode): built with its keyword
    arguments; ``generate`` returns hash-derived completions of ``length`` tokens and a sampler log-prob per token."""

    length = 16

    def __init__(self, *, processing_class, **kwargs):
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self.vocab = len(tokenizer)
        self.avoid = set(tokenizer.all_special_ids)

    def sync_weights(self):
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        completions, logprobs = [], []
        for index, prompt in enumerate(prompts):
            ids = _hash_tokens(str(prompt), index, self.length, self.vocab, self.avoid)
            completions.append(ids)
            logprobs.append([[-2.0] for _ in ids])
        return prompts, completions, logprobs, None


def hashed_reward(completions, **kwargs) -> list[float]:
    """0 or 1 from a hash of the completion: groups with both, so that every step has non-zero advantages."""
    return [float(hashlib.sha256(str(c).encode()).digest()[0] % 2) for c in completions]


def _step_clock(trainer):
    """A callback, added to ``trainer``, that records each step's seconds and its forward passes of the model."""
    from transformers import TrainerCallback

    forwards = [0]
    trainer.model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    class StepClock(TrainerCallback):
        seconds: list[float] = []
        forwards: list[int] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started, self.forwards_before = time.perf_counter(), forwards[0]

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.started)
            self.forwards.append(forwards[0] - self.forwards_before)

    clock = StepClock()
    trainer.add_callback(clock)
    return clock


def worker(arm: str, seed: int, steps: int, warmup: int, length: int, num_threads: int | None) -> dict:
    import trl.trainer.grpo_trainer as trl_grpo
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import trl_reasoning as tr
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.arithmetic import ArithmeticTask

    threads = use_free_cores(num_threads)
    InstantEngine.length = length
    trl_grpo.VLLMGeneration = InstantEngine
    path = str(smollm2_path())
    settings = cpu_config_kwargs(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=length,
        learning_rate=2e-4,
        max_steps=warmup + steps,
        logging_steps=1,
        seed=seed,
        use_vllm=True,
        vllm_mode="colocate",
        # the stand-in's log-probs are not the model's: a truncated (not masked) ratio keeps every gradient non-zero
        vllm_importance_sampling_mode="token_truncate",
        log_level="warning",
    )
    if arm == "trl":
        config_class, trainer_class = GRPOConfig, GRPOTrainer
        settings.update(loss_type="dapo", epsilon_high=0.28)
    else:
        config_class, trainer_class = tr.DAPOConfig, tr.DAPOTrainer
        settings.update(dynamic_sampling=False)
        if arm == "ours-trl-forward":
            settings.update(TRL_FORWARD_SWITCH)
    trainer = trainer_class(
        model=path,
        reward_funcs=hashed_reward,
        args=config_class(**settings),
        train_dataset=Dataset.from_list(ArithmeticTask().rl_rows("train")),
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    clock = _step_clock(trainer)
    trainer.train()
    return {
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "threads": threads,
        "step_seconds": clock.seconds[warmup:],
        "forwards_per_step": statistics.median(clock.forwards[warmup:]),
        "load": os.getloadavg()[0],
    }


def _key(arm: str, seed: int, options) -> str:
    return f"{arm}/{seed}/{options.steps}/{options.length}"


def collect(options) -> None:
    for seed in options.seeds:
        for arm in options.arms:
            key = _key(arm, seed, options)
            if key in read_runs(RUNS) and not options.rerun:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                command = [sys.executable, __file__, "--worker", json.dumps([arm, seed]), "--out", out]
                command += ["--steps", str(options.steps), "--warmup", str(options.warmup)]
                command += ["--length", str(options.length)]
                if options.num_threads is not None:
                    command += ["--num_threads", str(options.num_threads)]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise RuntimeError(f"{key} failed:\n{result.stderr[-4000:]}")
                run = json.loads(Path(out).read_text())
            save_run(RUNS, key, run)
            print(f"{key}: {statistics.median(run['step_seconds']):.2f} s/step, {run['threads']} threads", flush=True)


def summarize(options) -> str:
    recorded = read_runs(RUNS)
    by_arm: dict[str, dict[int, dict]] = {arm: {} for arm in options.arms}
    for arm in options.arms:
        for seed in options.seeds:
            run = recorded.get(_key(arm, seed, options))
            if run is not None:
                by_arm[arm][seed] = run
    wanted = [_key(arm, seed, options) for arm in options.arms for seed in options.seeds]
    require_recorded_runs(sum(map(len, by_arm.values())), RUNS, wanted, list(recorded))
    base = by_arm.get("trl", {})
    lines = [
        "| arm | seeds | s/step (median) | model forwards a step | step time vs `trl` [95% t] | torch threads |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for arm, seeds in by_arm.items():
        if not seeds:
            continue
        median = statistics.median(s for run in seeds.values() for s in run["step_seconds"])
        paired = [
            statistics.median(run["step_seconds"]) / statistics.median(base[seed]["step_seconds"])
            for seed, run in seeds.items()
            if seed in base
        ]
        ratio = "–"
        if len(paired) >= 2:
            mean, low, high = geometric_t_interval(paired)
            ratio = f"{mean:.3f}x [{low:.3f}, {high:.3f}]"
        forwards = statistics.median(run["forwards_per_step"] for run in seeds.values())
        threads = sorted({run["threads"] for run in seeds.values()})
        lines.append(
            f"| {arm} | {len(seeds)} | {median:.2f} | {forwards:g} | {ratio} | {', '.join(map(str, threads))} |"
        )
    loads = [run["load"] for seeds in by_arm.values() for run in seeds.values()]
    table = (
        f"SmolLM2-135M-Instruct with LoRA r=16, 16 completions of {options.length} tokens a step from an engine "
        f"stand-in that answers at once (sampler log-probs supplied, TRL's importance-sampling correction on), "
        f"{options.steps} steps after {options.warmup} warm-up, seeds {options.seeds}, each run a fresh process. "
        "Model forwards a step: calls of the policy's forward (TRL's `pi_old` scoring and the loss's; a no-grad "
        f"scoring pass is one call per micro-batch). Load average at the end of the runs: median "
        f"{statistics.median(loads):.1f} (max {max(loads):.1f}) on {os.cpu_count()} CPU threads.\n\n"
        + "\n".join(lines)
    )
    print(table)
    record("The synchronous vLLM path: pi_old from the loss's forward (real model)", table)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--length", type=int, default=16, help="completion tokens")
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: the free cores)")
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--summarize", action="store_true", help="only the table, from the recorded runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        arm, seed = json.loads(options.worker)
        result = worker(arm, seed, options.steps, options.warmup, options.length, options.num_threads)
        Path(options.out).write_text(json.dumps(result))
        return
    if not options.summarize:
        collect(options)
    summarize(options)


if __name__ == "__main__":
    main()
