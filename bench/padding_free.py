"""Padding-free training on ragged completions: step time and peak memory against TRL's ``GRPOTrainer``, on the real
model (SmolLM2-135M-Instruct), with LoRA and with full fine-tuning.

Both sides train TRL's GRPO with the same settings, activation checkpointing on as TRL's default has it
(``--no-checkpointing`` turns it off on both): ours is ``ReasoningTrainer`` (``padding_free`` at its default, on for
this model), TRL's is ``GRPOTrainer``, which pads every row of a micro-batch to its longest. The completions
are replayed by a ``rollout_func`` (no generation), so both train on the same tokens and the step is the training
work alone: the policy's forward, the loss, backward and the optimizer. Their lengths follow a stated distribution,
log-normal with a mean of 91 tokens capped at ``max_completion_length=512`` (each completion's length a function of
its prompt and of its index in the group, so both sides see the same ones):

- ``long-tailed``: sigma 1.3, a mean/max of about 0.22 per batch of 16 (the shape of a reasoning model's lengths:
  most answers short, a few running long);
- ``moderate``: sigma 0.65, a mean/max of about 0.4;
- ``equal``: every completion 91 tokens (only the prompts differ in length): the case with nothing to gain, which
  must not lose.

Time: the two trainers of a pair live in this one process and train in strict turns of one step
(``bench/overhead.py``'s ``interleaved_session``), so each step is paired with the other side's next to it in time; the
ratio ours / TRL is the geometric mean of the paired step ratios with a 95% two-stage bootstrap interval over
``--sessions`` fresh pairs. Memory: each side trains alone in a fresh process; the peak resident memory above the level
just before ``train()``. The last row trains with real generation (HF ``generate``, the same seed on both sides, so the
same completions while the weights agree): what a user's whole step gains. Usage:

    python bench/padding_free.py [--sessions 3] [--steps 3] [--rows ...] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import measure_train, run_worker  # noqa: E402
from _results import record  # noqa: E402
from overhead import interleaved_session, paired_logs, ratio_interval  # noqa: E402

MEAN_LENGTH = 91
MAX_COMPLETION_LENGTH = 512
#: distribution -> sigma of the log-normal (0: every completion MEAN_LENGTH tokens)
DISTRIBUTIONS = {"long-tailed": 1.3, "moderate": 0.65, "equal": 0.0}
#: The goals of the time ratio ours / TRL by distribution (the issue's): well under where padding dominates, no loss
#: where there is none.
TIME_GOALS = {"long-tailed": 0.4, "moderate": 0.6, "equal": 1.02}
MEMORY_GOAL = 0.8
#: row -> (distribution, tuning); "generate" rows sample with HF generate instead of replaying.
ROWS = {
    "long-tailed, LoRA": ("long-tailed", "lora"),
    "long-tailed, full": ("long-tailed", "full"),
    "moderate, LoRA": ("moderate", "lora"),
    "moderate, full": ("moderate", "full"),
    "equal, LoRA": ("equal", "lora"),
    "equal, full": ("equal", "full"),
    "generate, LoRA": ("generate", "lora"),
}
COMPLETIONS = 16
NUM_GENERATIONS = 8
GENERATE_LENGTH = 192


def completion_length(text: str, index: int, distribution: str, cap: int, mean: int = MEAN_LENGTH) -> int:
    """The length of the ``index``-th completion of prompt ``text``: a log-normal quantile (mean ``mean`` before the
    cap) drawn from a hash of both, so both sides of a pair replay the same one."""
    sigma = DISTRIBUTIONS[distribution]
    if sigma == 0.0:
        return min(mean, cap)
    digest = hashlib.sha256(f"{text}|{index}".encode()).digest()
    uniform = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    normal = statistics.NormalDist().inv_cdf(uniform)
    mu = math.log(mean) - sigma**2 / 2
    return max(1, min(cap, round(math.exp(mu + sigma * normal))))


def replay_rollout(tokenizer, distribution: str, cap: int, mean: int):
    """A ``rollout_func`` that replays completions of the distribution's lengths (hash-derived ids of ordinary
    tokens, no end-of-sequence token)."""
    special = set(tokenizer.all_special_ids)
    ordinary = [token for token in range(len(tokenizer)) if token not in special]

    def rollout(prompts, trainer):
        seen: dict[str, int] = {}
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            text = prompt[-1]["content"]
            index = seen.get(text, 0)
            seen[text] = index + 1
            length = completion_length(text, index, distribution, cap, mean)
            digest = hashlib.sha256(f"{text}|{index}|ids".encode()).digest()
            completion_ids.append([ordinary[(digest[i % 32] * 251 + i * 7919) % len(ordinary)] for i in range(length)])
            rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(tokenizer.encode(rendered, add_special_tokens=False))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def word_problems(n: int = 64):
    """GSM8K-style questions of varied length (their rendered prompts are 40-80 tokens with SmolLM2's template)."""
    from datasets import Dataset

    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis"]
    things = ["clips", "muffins", "books", "stickers", "marbles", "apples"]
    rows = []
    for i in range(n):
        a, b, c = 3 + i % 17, 2 + (i * 7) % 11, 1 + (i * 5) % 9
        question = (
            f"{names[i % len(names)]} had {a * 4} {things[i % len(things)]}. She gave {b} to each of her {c} friends"
            + (f" and then bought {a} more at the store for ${b}.{c}0 each" if i % 2 else "")
            + ". How many does she have now?"
            + (" Explain your reasoning step by step." if i % 3 == 0 else "")
        )
        rows.append({"prompt": [{"role": "user", "content": question}]})
    return Dataset.from_list(rows)


def correct_reward(completions, **kwargs) -> list[float]:
    """A reward that differs between completions (so every group has a nonzero advantage)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(text) % 5) for text in texts]


def build_trainer(side: str, row: str, steps: int, options, model_path: str):
    """One side (``"ours"`` or ``"trl"``) of ``row``: TRL's GRPO through ``ReasoningTrainer`` or ``GRPOTrainer``."""
    import trl
    from transformers import AutoTokenizer

    import trl_reasoning
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.utils.checkpointing import CHECKPOINTING_FIELD

    distribution, tuning = ROWS[row]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    cap = options.max_length
    settings = dict(
        **cpu_config_kwargs(**{CHECKPOINTING_FIELD: options.checkpointing}),
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=options.completions,
        num_generations=options.num_generations,
        max_completion_length=cap if distribution != "generate" else options.generate_length,
        max_steps=steps,
        learning_rate=1e-5,
        logging_steps=1,
        seed=0,
    )
    config_class, trainer_class = (
        (trl_reasoning.ReasoningConfig, trl_reasoning.ReasoningTrainer)
        if side == "ours"
        else (trl.GRPOConfig, trl.GRPOTrainer)
    )
    extra = {}
    if tuning == "lora":
        from peft import LoraConfig

        extra["peft_config"] = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    if distribution != "generate":
        extra["rollout_func"] = replay_rollout(tokenizer, distribution, cap, options.mean_length)
    return trainer_class(
        model=model_path,
        reward_funcs=correct_reward,
        args=config_class(**settings),
        train_dataset=word_problems(),
        processing_class=tokenizer,
        **extra,
    )


def model_path(options) -> str:
    if options.quick:
        from trl_reasoning.models.tiny import save_tiny_model

        return str(save_tiny_model(tempfile.mkdtemp(prefix="padding-free-tiny-"), seed=0))
    from trl_reasoning.models.pretrained import smollm2_path

    return str(smollm2_path())


def length_shape(row: str, options) -> tuple[float, int]:
    """The distribution's mean/max per batch of ``completions`` (averaged over the dataset's batches) and its max."""
    distribution, _ = ROWS[row]
    if distribution == "generate":
        return math.nan, options.generate_length
    dataset = word_problems()
    ratios, longest = [], 0
    prompts_per_batch = options.completions // options.num_generations
    for start in range(0, len(dataset) - prompts_per_batch + 1, prompts_per_batch):
        lengths = [
            completion_length(
                dataset[i]["prompt"][-1]["content"], j, distribution, options.max_length, options.mean_length
            )
            for i in range(start, start + prompts_per_batch)
            for j in range(options.num_generations)
        ]
        ratios.append(statistics.fmean(lengths) / max(lengths))
        longest = max(longest, max(lengths))
    return statistics.fmean(ratios), longest


def memory_worker(argv: list[str]) -> None:
    """``--worker-out OUT --side SIDE --row ROW ...``: one side trains alone; its peak memory and step times."""
    import json

    parser = _parser()
    parser.add_argument("--worker-out", required=True)
    parser.add_argument("--side", required=True)
    parser.add_argument("--row", required=True)
    options = parser.parse_args(argv)
    result = measure_train(
        build_trainer(options.side, options.row, options.warmup + options.steps, options, model_path(options))
    )
    with open(options.worker_out, "w") as f:
        json.dump(result, f)


def measure(row: str, options, path: str) -> dict:
    """Step times of both sides (interleaved sessions) and the peak memory of each (a fresh process each)."""
    times = {"ours": [], "trl": []}
    for session in range(options.sessions):
        clocks = interleaved_session(
            lambda side: build_trainer(side, row, options.warmup + options.steps, options, path),
            first="ours" if session % 2 == 0 else "trl",
        )
        for side, clock in clocks.items():
            times[side].append(clock.wall[options.warmup :])
    memory = {}
    if options.memory:
        arguments = _forwarded(options)
        for side in ("ours", "trl"):
            result = run_worker(
                os.path.abspath(__file__),
                ["--side", side, "--row", row, *arguments],
                in_process=memory_worker if options.quick else None,
            )
            memory[side] = result["peak_mib"]
    return {"times": times, "memory": memory}


def _forwarded(options) -> list[str]:
    arguments = [
        "--steps",
        str(options.steps),
        "--warmup",
        str(options.warmup),
        "--completions",
        str(options.completions),
        "--num-generations",
        str(options.num_generations),
        "--max-length",
        str(options.max_length),
        "--mean-length",
        str(options.mean_length),
        "--generate-length",
        str(options.generate_length),
    ]
    return (
        arguments + (["--quick"] if options.quick else []) + ([] if options.checkpointing else ["--no-checkpointing"])
    )


def row_line(row: str, result: dict, options) -> str:
    distribution, tuning = ROWS[row]
    shape, longest = length_shape(row, options)
    ratio = ratio_interval(paired_logs(result["times"]["ours"], result["times"]["trl"]))
    median = {side: statistics.median(t for s in result["times"][side] for t in s) for side in ("ours", "trl")}
    goal = TIME_GOALS.get(distribution)
    met = "n/a" if goal is None else ("met" if ratio[2] <= goal else "missed" if ratio[1] > goal else "undecided")
    memory = result["memory"]
    memory_cells = "| | |"
    if memory:
        memory_ratio = memory["ours"] / memory["trl"] if memory["trl"] > 0 else math.nan
        memory_cells = f"| {memory['ours']:.0f} / {memory['trl']:.0f} | {memory_ratio:.2f} |"
    shape_cell = "real generation" if math.isnan(shape) else f"{shape:.2f} (max {longest})"
    return (
        f"| {distribution} | {tuning} | {shape_cell} | {median['ours']:.2f} | {median['trl']:.2f} | "
        f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] | {'' if goal is None else f'≤ {goal}'} {met} "
        f"{memory_cells}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3, help="fresh trainer pairs per row")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side and session")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each session left out")
    parser.add_argument("--completions", type=int, default=COMPLETIONS, help="completions per step")
    parser.add_argument("--num-generations", type=int, default=NUM_GENERATIONS)
    parser.add_argument("--max-length", type=int, default=MAX_COMPLETION_LENGTH, help="max_completion_length")
    parser.add_argument("--mean-length", type=int, default=MEAN_LENGTH, help="the distributions' mean length")
    parser.add_argument("--generate-length", type=int, default=GENERATE_LENGTH, help="the generate row's max length")
    parser.add_argument(
        "--no-checkpointing",
        dest="checkpointing",
        action="store_false",
        help="train without activation checkpointing (TRL's default is on, as here)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model and short lengths: checks the script runs")
    return parser


def main(argv: list[str] | None = None) -> str:
    parser = _parser()
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory processes")
    options = parser.parse_args(argv)
    if options.quick:
        options.sessions, options.steps, options.warmup = 1, 1, 1
        options.max_length, options.mean_length, options.generate_length = 24, 6, 8
        options.completions, options.num_generations = 8, 4
        options.rows = [row for row in options.rows if ROWS[row][1] == "lora"][:2]
    path = model_path(options)
    import torch

    lines = [
        f"{'tiny model (quick)' if options.quick else 'SmolLM2-135M-Instruct'} in float32 on the CPU "
        f"({torch.get_num_threads()} torch threads, activation checkpointing {'on' if options.checkpointing else 'off'}), "
        f"TRL's GRPO on both sides, {options.completions} completions a step "
        f"({options.num_generations} per prompt), replayed by a rollout_func: lengths log-normal with mean "
        f"{options.mean_length} capped at {options.max_length} tokens; {options.sessions} fresh pairs x "
        f"{options.steps} steps (after {options.warmup} warm-up) per row. Ratio: ours / TRL, geometric mean of paired "
        "steps [95% CI]. Memory: peak resident MiB above the level before train(), each side alone.",
        "",
        "| lengths | tuning | mean/max per batch | ours s/step | TRL s/step | time ratio [95% CI] | goal | peak MiB "
        "ours / TRL | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for row in options.rows:
        line = row_line(row, measure(row, options, path), options)
        lines.append(line)
        print(line, flush=True)
    table = "\n".join(lines)
    if not options.quick:
        record("Padding-free training on ragged completions (SmolLM2-135M-Instruct, CPU)", table)
    return table


if __name__ == "__main__":
    if "--worker-out" in sys.argv:
        memory_worker(sys.argv[1:])
    else:
        main()
