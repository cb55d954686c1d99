"""Gradient of one optimizer step for several (policy loss, aggregation) pairs; run in-process or under torchrun.

Completions come from a deterministic ``rollout_func`` (a function of the prompt and of the completion's index in
its group), so every way of splitting the batch sees exactly the same global batch. Usage under torchrun:
``torchrun --nproc_per_node 2 tests/trainer/split_worker.py MODEL_PATH OUT_FILE PER_DEVICE GA``.
"""

from __future__ import annotations

import hashlib
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs  # noqa: E402
from trl_reasoning.tasks.digit_reversal import digit_reward  # noqa: E402

# Every aggregation appears at least once; the losses cover token-level and sequence-level objectives.
COMBINATIONS = [
    ("clip", "token_mean"),
    ("clip", "seq_mean_token_mean"),
    ("clip", "seq_mean_token_sum_norm"),
    ("sequence_clip", "seq_mean_token_sum"),
    ("cispo", "prompt_mean"),
    ("dppo", "token_mean"),
]
GLOBAL_BATCH = 8
NUM_GENERATIONS = 4
MAX_COMPLETION_LENGTH = 12


def rollout(prompts, trainer):
    """Deterministic completions of varied lengths (some truncated, some ending with EOS)."""
    tokenizer = trainer.processing_class
    seen: dict[str, int] = {}
    prompt_ids, completion_ids = [], []
    for prompt in prompts:
        text = prompt[-1]["content"]
        index = seen.get(text, 0)
        seen[text] = index + 1
        digest = hashlib.sha256(f"{text}|{index}".encode()).hexdigest()
        length = 2 + int(digest[0], 16) % (MAX_COMPLETION_LENGTH - 1)
        body = tokenizer.encode(digest[1 : 1 + length], add_special_tokens=False)[:length]
        ends = int(digest[-1], 16) % 2 == 0 and len(body) < MAX_COMPLETION_LENGTH
        completion_ids.append(body + ([tokenizer.eos_token_id] if ends else []))
        text_prompt = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        prompt_ids.append(tokenizer.encode(text_prompt, add_special_tokens=False))
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


class CaptureGradients(TrainerCallback):
    def __init__(self):
        self.gradients = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.gradients is None:
            self.gradients = torch.cat([p.grad.detach().flatten() for p in model.parameters() if p.grad is not None])


def gradients(
    model_path: str, per_device: int, grad_accum: int, output_dir: str, padding_free: bool | None = None
) -> dict[str, torch.Tensor]:
    from datasets import Dataset

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(8)])
    results = {}
    for policy_loss, aggregation in COMBINATIONS:
        capture = CaptureGradients()
        args = tr.ReasoningConfig(
            **cpu_config_kwargs(),
            output_dir=output_dir,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=grad_accum,
            num_generations=NUM_GENERATIONS,
            max_completion_length=MAX_COMPLETION_LENGTH,
            max_steps=1,
            max_grad_norm=0.0,  # the callback sees gradients after clipping: keep them raw
            seed=0,
            policy_loss=policy_loss,
            loss_aggregation=aggregation,
            epsilon_high=5.0 if policy_loss == "cispo" else None,
            overlong_cache_length=4,  # shaping uses the gathered lengths: part of what must not depend on the split
            padding_free=padding_free,
        )
        trainer = tr.ReasoningTrainer(
            model=model_path,
            reward_funcs=digit_reward,
            args=args,
            train_dataset=dataset,
            rollout_func=rollout,
            callbacks=[capture],
        )
        trainer.train()
        results[f"{policy_loss}+{aggregation}"] = capture.gradients.clone()
    return results


if __name__ == "__main__":
    model_path, out_file, per_device, grad_accum = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    grads = gradients(model_path, per_device, grad_accum, os.path.dirname(out_file))
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(grads, out_file)
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
