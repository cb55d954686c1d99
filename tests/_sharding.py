"""Sharding strategies for two-process CPU runs (gloo), shared by ``tests/journeys/sharded_worker.py`` and
``bench/dppo_topk_sharded.py`` (which imports it from here): training-config arguments for DDP, DeepSpeed ZeRO-2/3 and
FSDP2.

DeepSpeed runs on CPUs as it is (its CPU accelerator). FSDP does not: accelerate 1.15 turns an FSDP plugin into FSDP
only for GPU-type backends and keeps DDP on ``MULTI_CPU`` (trl-reasoning's trainer warns when that happens).
``force_fsdp_on_cpu`` makes accelerate honour the plugin on CPUs; it is a device for tests and benchmarks, not a way
to train.
"""

from __future__ import annotations

import os

STRATEGIES = ("ddp", "zero2", "zero3", "fsdp2")


def deepspeed_config(stage: int) -> dict:
    """A ZeRO config whose "auto" values the Trainer fills from the training arguments. With stage 3 the persistence
    threshold is 0, so every parameter is partitioned (DeepSpeed's default keeps parameters under 1e5 elements whole,
    which is all of a tiny model). No ``train_batch_size``: DeepSpeed derives it (an "auto" one is checked against a
    world size of 1 while transformers builds the model under ``zero.Init``)."""
    zero: dict = {"stage": stage}
    if stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    return {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }


def force_fsdp_on_cpu() -> None:
    """Make accelerate run FSDP on a CPU (``MULTI_CPU``) when it is given an FSDP plugin, as it does on GPUs."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_forces_fsdp_on_cpu", False):
        return

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        use_fsdp = fsdp_plugin is not None or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if use_fsdp and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if fsdp_plugin is not None:
                self.fsdp_plugin = fsdp_plugin

    init._forces_fsdp_on_cpu = True
    AcceleratorState.__init__ = init


def reset_strategy_state(environment: dict[str, str]) -> None:
    """Forget the strategy a finished run set up in this process, so the next run starts as a fresh launch would:
    accelerate's shared AcceleratorState/GradientState (the process group, PartialState, stays), transformers' global
    DeepSpeed config (it decides whether models are built under ``zero.Init``) and the ACCELERATE_*/FSDP_* variables
    the training arguments exported."""
    from accelerate.state import AcceleratorState, GradientState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    unset_hf_deepspeed_config()
    os.environ.clear()
    os.environ.update(environment)


def strategy_kwargs(strategy: str) -> dict:
    """The training-config arguments of ``strategy`` (one of ``STRATEGIES``); ``fsdp2`` also forces FSDP on CPUs."""
    if strategy == "ddp":
        return {}
    if strategy in ("zero2", "zero3"):
        return {"deepspeed": deepspeed_config(int(strategy[-1]))}
    if strategy == "fsdp2":
        force_fsdp_on_cpu()
        return {
            "fsdp": "full_shard",
            "fsdp_config": {
                "fsdp_version": 2,
                "reshard_after_forward": True,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"],
            },
        }
    raise ValueError(f"Unknown strategy {strategy!r}. Allowed values: {', '.join(STRATEGIES)}.")
