"""DPPO top-K divergence vs binary divergence vs plain DAPO: peak training memory and step time, in one run.

The model is a small randomly initialised Qwen2 with a 32k-token vocabulary, so that the ``[batch, T, vocab]``
logits dominate memory as they do in real LLMs; completions come from a deterministic ``rollout_func`` so that every
configuration trains on exactly the same batch. Each configuration runs in its own subprocess (repeated and
interleaved), and memory is the peak resident set size during ``train()`` above the level just before it (Linux
``/proc/self/clear_refs`` resets the peak). Step time is TRL's ``step_time`` metric. Prints a markdown table with
medians and the ratios to ``binary_tv``. Usage:

    python bench/dppo_topk.py [--steps 6] [--repeats 2] [--quick]
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

CONFIGS = {
    "DPPO topk_tv": {"trainer": "DPPO", "dppo_divergence": "topk_tv"},
    "DPPO binary_tv": {"trainer": "DPPO", "dppo_divergence": "binary_tv"},
    "DAPO": {"trainer": "DAPO", "dynamic_sampling": False},
}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(name: str, steps: int, vocab: int, length: int, out_file: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import trl_reasoning as tr
    from trl_reasoning.demo.tiny import build_tokenizer, cpu_config_kwargs

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)

    def rollout(prompts, trainer):
        prompt_ids, completion_ids = [], []
        for index, prompt in enumerate(prompts):
            text = prompt[-1]["content"]
            digest = hashlib.sha256(f"{text}|{index}".encode()).digest()
            completion_ids.append([digest[i % len(digest)] % len(tokenizer) for i in range(length)])
            rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(tokenizer.encode(rendered, add_special_tokens=False))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def reward(completion_ids, **kwargs):
        return [float(sum(ids) % 7) for ids in completion_ids]

    spec = dict(CONFIGS[name])
    trainer_name = spec.pop("trainer")
    config_class, trainer_class = {
        "DPPO": (tr.DPPOConfig, tr.DPPOTrainer),
        "DAPO": (tr.DAPOConfig, tr.DAPOTrainer),
    }[trainer_name]
    args = config_class(
        **cpu_config_kwargs(),
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=length,
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        seed=0,
        **spec,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(64)])
    trainer = trainer_class(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    trainer.train()
    peak = _rss_kib("VmHWM")
    times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry][1:]  # skip warm-up
    with open(out_file, "w") as f:
        json.dump({"peak_mib": (peak - before) / 1024, "step_times": times}, f)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--length", type=int, default=128, help="completion length in tokens")
    parser.add_argument("--quick", action="store_true", help="2 steps, small vocab: checks the script runs")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.quick:
        options.steps, options.repeats, options.vocab, options.length = 2, 1, 512, 16
    if options.worker:
        worker(options.worker[0], options.steps, options.vocab, options.length, options.worker[1])
        return ""

    results: dict[str, dict[str, list[float]]] = {name: {"peak": [], "time": []} for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(options.repeats):
            for name in CONFIGS:  # interleaved: A B C A B C
                out = os.path.join(tmp, f"{repeat}-{name.replace(' ', '_')}.json")
                command = [sys.executable, __file__, "--worker", name, out, "--steps", str(options.steps)]
                command += ["--vocab", str(options.vocab), "--length", str(options.length)]
                subprocess.run(command, check=True, capture_output=True, text=True)
                with open(out) as f:
                    data = json.load(f)
                results[name]["peak"].append(data["peak_mib"])
                results[name]["time"].extend(data["step_times"])

    base = results["DPPO binary_tv"]
    base_peak, base_time = statistics.median(base["peak"]), statistics.median(base["time"])
    lines = [
        f"DPPO top-K vs binary vs DAPO: vocab {options.vocab}, 8 completions x {options.length} tokens per step, "
        f"{options.steps} steps x {options.repeats} interleaved repeats, CPU (medians; step time without the first step)",
        "",
        "| configuration | peak memory in train() (MiB) | ratio to binary_tv | step time (s) | min-max | ratio to binary_tv |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        peak, time = statistics.median(r["peak"]), statistics.median(r["time"])
        lines.append(
            f"| {name} | {peak:.0f} | {peak / base_peak:.2f} | {time:.3f} | {min(r['time']):.3f}-{max(r['time']):.3f} | "
            f"{time / base_time:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("DPPO top-K vs binary vs DAPO", table)
    return table


if __name__ == "__main__":
    main()
