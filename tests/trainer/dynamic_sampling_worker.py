"""Two-process dynamic sampling (run under torchrun): the reward keeps different numbers of groups on each rank.

Usage: ``torchrun --nproc_per_node 2 tests/trainer/dynamic_sampling_worker.py MODEL_PATH OUT_DIR``. Each rank writes
``rank{r}.json`` with the decisions it took (rounds, chosen groups, active flags), its rows and a checksum of the
parameters after training.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs  # noqa: E402


def reward(prompts, completions, **kwargs) -> list[float]:
    """Prompts "fixed …" always score 1 (uninformative groups); others score a hash of the completion."""
    out = []
    for prompt, completion in zip(prompts, completions):
        text, done = prompt[-1]["content"], completion[-1]["content"]
        out.append(1.0 if text.startswith("fixed") else (sum(map(ord, done)) % 11) / 10.0)
    return out


def main(model_path: str, out_dir: str) -> None:
    # Unshuffled order: batch 1 = [fixed 0, open 0] -> rank 0 holds an uninformative group, rank 1 an informative one.
    texts = ["fixed 0", "open 0", "fixed 1", "fixed 2", "open 1", "fixed 3", "open 2", "open 3"]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in texts])
    args = tr.DAPOConfig(
        **cpu_config_kwargs(),
        output_dir=out_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        seed=0,
        shuffle_dataset=False,
        logging_steps=1,
    )
    trainer = tr.DAPOTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=dataset)
    decisions, rows = [], []

    class RecordBatches(TrainerCallback):
        """What each step trained on, from the trainer's public ``last_train_batch``."""

        def on_step_end(self, args, state, control, **kwargs):
            batch = trainer.last_train_batch
            decisions.append({"rewards": batch.rewards.tolist(), "active": batch.active_groups.tolist()})
            rows.append(int(batch.loss_weights.shape[0]))

    trainer.add_callback(RecordBatches())
    trainer.train()
    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    rounds = [
        entry["group_selection/generation_rounds"]
        for entry in trainer.state.log_history
        if "group_selection/generation_rounds" in entry
    ]
    rank = trainer.accelerator.process_index
    report = {"decisions": decisions, "rows": rows, "parameter_checksum": checksum, "rounds": rounds}
    report["steps"] = trainer.state.global_step
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.barrier() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
