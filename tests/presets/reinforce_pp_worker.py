"""Two-process REINFORCE++ (run under torchrun): per-token advantages normalised over the batch of both ranks.

Usage: ``torchrun --nproc_per_node 2 tests/presets/reinforce_pp_worker.py MODEL_PATH OUT_DIR``. Each rank writes
``rank{r}.json`` with, for every generation batch, what the estimator read (the rewards, the counted tokens and the
per-token KL, gathered from both ranks and padded to the longest completion), the gathered advantages, this rank's own
advantages, and a checksum of the parameters after training. The tiny model rarely ends a completion early, so
every completion would be ``max_completion_length`` long on both ranks: rank 1 samples at most 6 tokens, rank 0 at
most 8, and their completions differ in width as they would when one rank's longest completion is shorter.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs  # noqa: E402
from trl_reasoning.tasks.digit_reversal import digit_reward  # noqa: E402


def main(model_path: str, out_dir: str) -> None:
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i * 7 % 10}="}]} for i in range(16)])
    rank = int(os.environ.get("RANK", "0"))
    args = tr.ReinforcePPConfig(
        **cpu_config_kwargs(),
        output_dir=out_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8 if rank == 0 else 6,
        max_steps=3,
        learning_rate=1e-2,
        seed=0,
        logging_steps=1,
        beta=0.5,
    )
    trainer = tr.ReinforcePPTrainer(model=model_path, reward_funcs=digit_reward, args=args, train_dataset=dataset)
    batches = []
    rollout = trainer.rollout
    token_inputs, finalize = rollout.token_inputs, rollout.finalize

    def recording_token_inputs(output, loss_mask, mode):
        inputs = token_inputs(output, loss_mask, mode)
        batches.append({"mask": inputs["completion_mask"].tolist(), "kl": inputs["token_kl"].tolist()})
        return inputs

    def recording_finalize(output, rewards, *rest, **kwargs):
        advantages = finalize(output, rewards, *rest, **kwargs)
        batches[-1].update(
            rewards=rewards.tolist(), advantages=advantages.tolist(), local=output["advantages"].tolist()
        )
        return advantages

    rollout.token_inputs, rollout.finalize = recording_token_inputs, recording_finalize
    trainer.train()
    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    assert rank == trainer.accelerator.process_index
    report = {"batches": batches, "parameter_checksum": checksum, "steps": trainer.state.global_step, "rank": rank}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.barrier() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
