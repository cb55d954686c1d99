"""Two-process journey worker (run under torchrun): DAPO with dynamic sampling (synchronous, and asynchronous with
k = 2) and ScaleRL with no-positive-resampling (asynchronous, its default),
checkpoints every 2 steps to step 5, or a restarted job resumed from checkpoint-4.

Usage: ``torchrun --nproc_per_node 2 tests/journeys/two_process_worker.py MODEL_PATH OUT_DIR train|resume``. For each
preset, each rank writes ``OUT_DIR/<preset>/<mode>-rank{r}.json``: its global step, losses by step, sampling metrics,
sampling state, the prompts of its reward calls and a checksum of its parameters.
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
from datasets import Dataset  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs  # noqa: E402

PRESETS = {
    "DAPO": (tr.DAPOTrainer, tr.DAPOConfig, {"dynamic_sampling": True}),
    "ScaleRL": (tr.ScaleRLTrainer, tr.ScaleRLConfig, {"positive_resampling_threshold": 0.9}),
    # asynchronous rollouts (ScaleRL above is asynchronous too, with its default k = 8) with dynamic sampling
    "DAPO-async": (
        tr.DAPOTrainer,
        tr.DAPOConfig,
        {"dynamic_sampling": True, "async_rollouts": True, "max_staleness": 2},
    ),
    # the same, sampled by a generator process on each rank: it must train as DAPO-async does
    "DAPO-async-process": (
        tr.DAPOTrainer,
        tr.DAPOConfig,
        {"dynamic_sampling": True, "async_rollouts": True, "max_staleness": 2, "async_generator": "process"},
    ),
}
MAX_STEPS = 5
SAVE_STEPS = 2
#: The run settings both two-process workers share (this one and ``sharded_worker.py``): 4 completions per rank and
#: step in one group of 4, short completions, a learning rate that moves the tiny model visibly.
TWO_PROCESS_RUN = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    learning_rate=1e-2,
    logging_steps=1,
    seed=0,
)
# 6 prompts, 2 groups a step over both ranks: an epoch is 3 steps, checkpoint-4 is in the middle of the second.
TEXTS = ["fixed 0", "open 0", "fixed 1", "open 1", "open 2", "fixed 2"]
#: The prompts of every reward call of the current run on this rank (one call per generation round).
REWARD_CALLS: list[list[str]] = []


def reward(prompts, completions, **kwargs) -> list[float]:
    """ "fixed …" prompts always score 1 (uninformative groups for dynamic sampling, pass rate 1 for ScaleRL, which
    retires them); "open …" prompts score 1 for about a third of the completions."""
    REWARD_CALLS.append(sorted({prompt[-1]["content"] for prompt in prompts}))
    return fixed_or_open_reward(prompts, completions)


def fixed_or_open_reward(prompts, completions, **kwargs) -> list[float]:
    """The scoring of ``reward`` without the record of calls (also used by ``sharded_worker.py``)."""
    out = []
    for prompt, completion in zip(prompts, completions):
        text, done = prompt[-1]["content"], completion[-1]["content"]
        out.append(1.0 if text.startswith("fixed") else float(sum(map(ord, done)) % 3 == 0))
    return out


def run(name: str, model_path: str, out_dir: str, mode: str) -> None:
    trainer_cls, config_cls, options = PRESETS[name]
    output_dir = os.path.join(out_dir, name)
    args = config_cls(
        **cpu_config_kwargs(save_strategy="steps"),
        output_dir=output_dir,
        save_steps=SAVE_STEPS,
        max_steps=MAX_STEPS,
        **TWO_PROCESS_RUN,
        **options,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in TEXTS])
    trainer = trainer_cls(model=model_path, reward_funcs=reward, args=args, train_dataset=dataset)
    REWARD_CALLS.clear()
    resume = os.path.join(output_dir, "checkpoint-4") if mode == "resume" else None
    trainer.train(resume_from_checkpoint=resume)
    history = trainer.state.log_history
    report = {
        "global_step": trainer.state.global_step,
        "losses": {str(e["step"]): e["loss"] for e in history if "loss" in e},
        "generation_rounds": [
            e["group_selection/generation_rounds"] for e in history if "group_selection/generation_rounds" in e
        ],
        "retired_prompts": [
            e["group_selection/retired_prompts"] for e in history if "group_selection/retired_prompts" in e
        ],
        "staleness": {str(e["step"]): e["async/staleness"] for e in history if "async/staleness" in e},
        "sampling_state": trainer.sampling_state_dict(),
        "reward_calls": list(REWARD_CALLS),
        "parameter_checksum": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
        "world_size": trainer.accelerator.num_processes,
    }
    rank = trainer.accelerator.process_index
    with open(os.path.join(output_dir, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    model_path, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    for preset in PRESETS:
        run(preset, model_path, out_dir, mode)
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
