"""Sharded-training worker (run under torchrun with two gloo processes): DAPO with dynamic sampling and DPPO with the
top-K TV divergence, three steps each with a checkpoint at step 2 that a fresh trainer then resumes from, under
each strategy: ``ddp``, ``zero2``, ``zero3`` (DeepSpeed, parameters
really partitioned) or ``fsdp2``, all with padding-free forwards (``padding_free``'s default), and ``ddp_padded``: DDP
with TRL's padded forwards, the reference the packed runs must match.

Usage: ``torchrun --nproc_per_node 2 tests/journeys/sharded_worker.py STRATEGIES MODEL_PATH OUT_DIR`` with
STRATEGIES comma-separated (``ddp,zero2,zero3,fsdp2``): one launch runs them in turn, resetting accelerate's and
transformers' process-wide state between them (``reset_strategy_state`` of ``tests/_sharding.py``), which saves a
process start (~10 s of imports on two processes) per strategy. Rank 0 writes ``OUT_DIR/<strategy>/<preset>.pt``: the
full parameters at the end, the losses and rewards by step, what the accelerator ran as, and whether DPPO's top-K kept
the LM-head path (no ``[B, T, vocab]`` logits).

The strategies' config arguments come from ``tests/_sharding.py`` (FSDP2 is forced onto the CPU there: accelerate
keeps DDP on CPUs without a word, which trl-reasoning's trainer reports).
"""

from __future__ import annotations

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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/
from _sharding import reset_strategy_state, strategy_kwargs  # noqa: E402
from two_process_worker import TWO_PROCESS_RUN  # noqa: E402
from two_process_worker import fixed_or_open_reward as reward  # noqa: E402  ("fixed …" scores 1, "open …" varies)

#: DDP with ``padding_free=False``: TRL's padded forwards, which every packed strategy must reproduce.
PADDED = "ddp_padded"
MAX_STEPS = 3
RESUME_FROM = 2  # a checkpoint at step 2; a fresh trainer resumes from it and trains step 3 again
TEXTS = ["fixed 0", "open 0", "fixed 1", "open 1", "open 2", "fixed 2", "open 3", "open 4"]
PRESETS = {
    "DAPO": (tr.DAPOTrainer, tr.DAPOConfig, {"dynamic_sampling": True, "max_num_gen_batches": 4}),
    "DPPO": (tr.DPPOTrainer, tr.DPPOConfig, {"dppo_divergence": "topk_tv", "dppo_topk": 4}),
}


def full_parameters(trainer) -> dict[str, torch.Tensor]:
    """Every parameter, whole, under any strategy (called on every rank: gathering is collective)."""
    model = trainer.model_wrapped if trainer.is_deepspeed_enabled else trainer.model
    params = dict(trainer.accelerator.unwrap_model(model).named_parameters())
    if trainer.is_deepspeed_enabled:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {name: p.detach().clone() for name, p in params.items()}
    out = {}
    for name, p in params.items():
        value = p.detach()
        out[name] = (value.full_tensor() if hasattr(value, "full_tensor") else value).clone()
    return out


def run(strategy: str, preset: str, model_path: str, out_dir: str, environment: dict[str, str]) -> None:
    trainer_cls, config_cls, options = PRESETS[preset]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in TEXTS])

    def make_trainer():
        args = config_cls(
            **cpu_config_kwargs(save_strategy="steps", save_steps=RESUME_FROM),
            **(strategy_kwargs("ddp") | {"padding_free": False} if strategy == PADDED else strategy_kwargs(strategy)),
            output_dir=os.path.join(out_dir, strategy, preset),
            max_steps=MAX_STEPS,
            **TWO_PROCESS_RUN,
            **options,
        )
        return trainer_cls(model=model_path, reward_funcs=reward, args=args, train_dataset=dataset)

    trainer = make_trainer()
    initial = full_parameters(trainer)
    trainer.train()
    final = full_parameters(trainer)
    history = trainer.state.log_history
    report = {
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else None,
        "global_step": trainer.state.global_step,
        "losses": [e["loss"] for e in history if "loss" in e],
        "rewards": [e["reward"] for e in history if "reward" in e],
        "lm_head_from_hidden": trainer.topk_forward.lm_head_from_hidden,
        "padding_free": trainer.packing.enabled,
        "head_inside_forward": trainer.topk_forward._sharded_lm_head(trainer.model_wrapped) is not None,
        "moved": max((final[n] - initial[n]).abs().max().item() for n in final),
        "parameters": final,
    }
    # A restarted job: a fresh trainer resumes from the sharded checkpoint (DeepSpeed's or FSDP's own format, with
    # the optimizer state and trl-reasoning's sampling state) and trains the last step again.
    reset_strategy_state(environment)  # as a new process would start
    resumed = make_trainer()
    resumed.train(resume_from_checkpoint=os.path.join(resumed.args.output_dir, f"checkpoint-{RESUME_FROM}"))
    resumed_final = full_parameters(resumed)
    report |= {
        "resumed_global_step": resumed.state.global_step,
        "resumed_losses": [e["loss"] for e in resumed.state.log_history if "loss" in e],
        "resumed_rewards": [e["reward"] for e in resumed.state.log_history if "reward" in e],
        "resume_difference": max((resumed_final[n] - final[n]).abs().max().item() for n in final),
    }
    if resumed.accelerator.is_main_process:
        torch.save(report, os.path.join(out_dir, strategy, f"{preset}.pt"))
    resumed.accelerator.wait_for_everyone()


if __name__ == "__main__":
    strategy_names, model, out = sys.argv[1:4]
    launch_environment = dict(os.environ)
    for strategy_name in strategy_names.split(","):
        for name in PRESETS:
            run(strategy_name, name, model, out, launch_environment)
            reset_strategy_state(launch_environment)
    if torch.distributed.is_initialized():  # a live gloo group can abort the rank at exit (SIGABRT)
        torch.distributed.destroy_process_group()
