"""Asynchronous memory at k = 8 (ScaleRL's default): the host RAM the asynchronous state holds and the size of its
checkpoint file, full fine-tune and LoRA, for the code on ``PYTHONPATH`` of each row (this checkout, and a
``--before`` checkout such as the main branch's, which kept the last k + 1 snapshots of the trainable weights).

ScaleRL (``async_rollouts`` on, ``max_staleness=8``, in-process generator) on the tiny offline model, 64 prompts, 2 a
step, so the read-ahead never reaches an epoch boundary. The RAM is what the asynchronous state's objects hold (weight
snapshots, sampled batches: tensors by their bytes, Python lists by ``sys.getsizeof`` of them and their items), the
peak over the steps before the last k (the steady state), and over the last k (where the weights of the first batch
after ``train()`` are kept); the checkpoint is written mid-run, at half the steps. Prints a markdown table. Usage:

    python bench/async_memory.py [--before ../main] [--steps 24] [--quick]

``--before`` is another checkout, e.g. a worktree of the main branch next to this one: ``git worktree add ../main
main``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STATE_FILES = ("trl_reasoning_behaviour_weights.pt", "trl_reasoning_async_batches_rank")


def deep_bytes(value, seen: set[int] | None = None) -> int:
    """The bytes ``value`` holds: tensors by their storage, containers with their items (each object once)."""
    import torch

    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(deep_bytes(k, seen) + deep_bytes(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ == "deque":
        return sys.getsizeof(value) + sum(deep_bytes(item, seen) for item in value)
    return sys.getsizeof(value)


def async_state(trainer) -> list:
    """What the asynchronous state holds, in the code being measured: the behaviour weights' snapshots and, where
    the pipeline keeps them, the sampled batches (submitted, sampled, restored)."""
    held: list = [trainer.async_rollouts.behaviour._snapshots]
    pipeline = getattr(trainer.async_rollouts, "pipeline", None)
    if pipeline is not None:
        held += [getattr(pipeline, name, None) for name in ("_jobs", "_ready", "_restored")]
        generator = getattr(pipeline, "_generator", None)
        held.append(getattr(generator, "_done", None))
    return held


def measure(lora: bool, steps: int, out: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    import trl_reasoning as tr
    from trl_reasoning.models.tiny import cpu_config_kwargs, save_tiny_model

    model_path = str(save_tiny_model(os.path.join(out, "model"), seed=0))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}="}]} for i in range(64)])
    settings = dict(
        output_dir=os.path.join(out, "run"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        max_steps=steps,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        save_strategy="steps",
        save_steps=steps // 2,
    )
    args = tr.ScaleRLConfig(**{**cpu_config_kwargs(), **settings})
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    def digit_fraction(completions, **kwargs):
        return [sum(ch.isdigit() for ch in c[-1]["content"]) / max(len(c[-1]["content"]), 1) for c in completions]

    trainer = tr.ScaleRLTrainer(
        model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=dataset, peft_config=peft_config
    )
    assert trainer.async_rollouts.behaviour is not None and trainer.async_rollouts.behaviour.max_staleness == 8
    peaks: list[int] = []

    class Peak(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            peaks.append(deep_bytes(async_state(trainer)))

    trainer.add_callback(Peak())
    with torch.random.fork_rng():
        torch.manual_seed(0)
        trainer.train()
    checkpoint = os.path.join(settings["output_dir"], f"checkpoint-{steps // 2}")
    state_file = sum(
        os.path.getsize(os.path.join(checkpoint, name))
        for name in os.listdir(checkpoint)
        if name.startswith(STATE_FILES)
    )
    trainable = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "ram_peak": max(peaks[: steps - 8] or [0]),
        "ram_tail": max(peaks[steps - 8 :]),
        "state_file": state_file,
        "trainable": trainable,
        "reason": getattr(getattr(trainer, "async_rollouts", None), "snapshot_reason", "(k + 1 snapshots)"),
    }


def run_measure(code_root: str, lora: bool, steps: int) -> dict:
    """:func:`measure` in a fresh interpreter that imports ``trl_reasoning`` from ``code_root``."""
    env = {**os.environ, "PYTHONPATH": code_root, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, os.path.abspath(__file__), "--measure", "--steps", str(steps)] + (
        ["--lora"] if lora else []
    )
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{command} with PYTHONPATH={code_root} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a checkout of the code to compare with (e.g. ../main)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="this checkout only, 10 steps: checks the script runs")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    steps = 10 if options.quick else options.steps
    if options.measure:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(options.lora, steps, tmp)))
        return ""
    codes = [("after (this checkout)", ROOT)]
    if options.before and not options.quick:
        codes.insert(0, ("before", options.before))
    lines = [
        f"Asynchronous state at k = 8 (ScaleRL, inline generator), tiny model, {steps} steps, checkpoint at step "
        f"{steps // 2}",
        "",
        f"| code | model | trainable weights | async RAM, peak over steps 1-{steps - 8} | async RAM, peak over the "
        "last 8 steps | checkpoint's async file | what it keeps |",
        "|---|---|---|---|---|---|---|",
    ]
    for code, root in codes:
        for lora in (False, True):
            r = run_measure(root, lora, steps)
            kept = (
                "k + 1 weight snapshots" if r["reason"] == "(k + 1 snapshots)" else (r["reason"] or "sampled batches")
            )
            lines.append(
                f"| {code} | {'LoRA r=8' if lora else 'full fine-tune'} | {kib(r['trainable'])} | {kib(r['ram_peak'])} "
                f"| {kib(r['ram_tail'])} | {kib(r['state_file'])} | {kept} |"
            )
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        sys.path.insert(0, HERE)
        from _results import record

        record("Asynchronous memory at k = 8", table)
    return table


if __name__ == "__main__":
    main()
