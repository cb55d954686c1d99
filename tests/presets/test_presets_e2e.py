"""Each preset trains a few steps on the tiny model (full fine-tune, LoRA, and one QLoRA run): the loss stays finite
and the trainable parameters move."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import PRESETS, cpu_args, digit_fraction, lora_config

import trl_reasoning as tr


def _train_and_check(trainer) -> None:
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable, "nothing to train"
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == trainer.args.max_steps
    assert all(math.isfinite(loss) for loss in losses), losses
    moved = {n for n, p in trainer.model.named_parameters() if n in trainable and not torch.equal(p, trainable[n])}
    assert moved, "no trainable parameter moved"
    advantages = [
        entry["advantages/abs_mean"] for entry in trainer.state.log_history if "advantages/abs_mean" in entry
    ]
    assert any(a > 0 for a in advantages), "every advantage was zero: the run tested nothing"


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_trains(name, use_lora, tiny_model_path, prompts, tmp_path):
    trainer_cls, config_cls, reward = PRESETS[name]
    trainer = trainer_cls(
        model=tiny_model_path,
        reward_funcs=reward,
        args=config_cls(**cpu_args(output_dir=str(tmp_path))),
        train_dataset=prompts,
        peft_config=lora_config() if use_lora else None,
    )
    if use_lora:
        assert all("lora" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    _train_and_check(trainer)


@pytest.mark.slow
def test_qlora_trains_on_cpu(tiny_model_path, prompts, tmp_path):
    """QLoRA: the base model is quantized to 4-bit NF4 by bitsandbytes (works on a CPU), LoRA adapters train."""
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    args = tr.DAPOConfig(
        **cpu_args(output_dir=str(tmp_path)),
        model_init_kwargs={"quantization_config": quantization, "device_map": {"": "cpu"}},
    )
    trainer = tr.DAPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=prompts,
        peft_config=lora_config(),
    )
    assert any("4bit" in type(m).__name__ for m in trainer.model.modules()), "the base model is not quantized"
    _train_and_check(trainer)


def test_reasoning_trainer_with_gradient_accumulation_and_iterations(tiny_model_path, prompts, tmp_path):
    """Off-policy path: GA=2 with two iterations per generation batch (old log-probs are computed by TRL)."""
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2),
        gradient_accumulation_steps=2,
        num_iterations=2,
        policy_loss="dppo",
        loss_aggregation="prompt_mean",
        advantage_estimator="rloo",
    )
    trainer = tr.ReasoningTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=prompts)
    _train_and_check(trainer)
