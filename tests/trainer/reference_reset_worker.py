"""Two-process worker of ``test_reference_reset.py`` (run under torchrun): the reference reset's KL trigger
(``reference_reset_kl``, no schedule) with ``beta=0.1``, one optimizer step per rollout batch, four steps.

Usage: ``torchrun --nproc_per_node 2 tests/trainer/reference_reset_worker.py MODEL_PATH OUT_DIR``. Each rank writes
``OUT_DIR/rank{r}.json``: the logged reset counts and last reset steps, and checksums of its reference and its policy.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from conftest import digit_fraction, make_prompts  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs  # noqa: E402


def main(model_path: str, out_dir: str) -> None:
    args = tr.ReasoningConfig(
        **cpu_config_kwargs(),
        output_dir=out_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        learning_rate=1e-2,
        beta=0.1,
        reference_reset_kl=1e-9,  # every rollout batch whose policy has left the reference
        logging_steps=1,
        seed=0,
    )
    trainer = tr.ReasoningTrainer(
        model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    trainer.train()
    history = trainer.state.log_history
    report = {
        "world_size": trainer.accelerator.num_processes,
        "resets": [e["reference/resets"] for e in history if "reference/resets" in e],
        "last_reset_step": [e["reference/last_reset_step"] for e in history if "reference/last_reset_step" in e],
        "reference_checksum": float(sum(p.detach().double().sum() for p in trainer.ref_model.parameters())),
        "parameter_checksum": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
    }
    with open(os.path.join(out_dir, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(report, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
