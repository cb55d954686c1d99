"""Journey: train with checkpoints every 2 steps to step 5, then resume a NEW trainer from checkpoint-4 to the end.

Every preset x {full fine-tune, LoRA, QLoRA}. The first run goes past each checkpoint (steps 3 and 5 follow the
saves at 2 and 4), and a second, freshly built trainer resumes from checkpoint-4 as a restarted job would: it must
reach max_steps with finite losses, move its trainable parameters and land where the uninterrupted run did.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_prompts

from journeys._helpers import (
    MAX_STEPS,
    PRESETS,
    assert_finite_losses,
    checkpoint_global_step,
    checkpoint_steps,
    journey_args,
    lora_config,
    moved_parameters,
    qlora_model_init_kwargs,
    rollout_args,
    step_losses,
    trainable_snapshot,
)

VARIANTS = ("full", "lora", "qlora")


def _build(name, variant, model_path, output_dir):
    trainer_cls, config_cls, reward = PRESETS[name]
    extra = {"model_init_kwargs": qlora_model_init_kwargs()} if variant == "qlora" else {}
    # 6 prompts, 2 a step: an epoch is 3 steps, so checkpoint-4 sits in the middle of the second epoch. GSPO: 2
    # prompts a rollout of 4 steps (an epoch is 12 steps), so checkpoint-4 sits between its first two rollouts.
    args = config_cls(**journey_args(output_dir, max_completion_length=8, **rollout_args(config_cls)), **extra)
    return trainer_cls(
        model=model_path,
        reward_funcs=reward,
        args=args,
        train_dataset=make_prompts(6),
        peft_config=None if variant == "full" else lora_config(),
    )


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(PRESETS))
def test_train_past_checkpoints_then_resume_to_the_end(name, variant, tiny_model_path, tmp_path):
    if variant == "qlora":
        pytest.importorskip("bitsandbytes")
    output_dir = tmp_path / "run"

    # 1. The first run: checkpoints at 2 and 4, and it trains on after each of them.
    first = _build(name, variant, tiny_model_path, output_dir)
    if variant != "full":
        assert all("lora" in n for n, p in first.model.named_parameters() if p.requires_grad)
    if variant == "qlora":
        assert any("4bit" in type(m).__name__ for m in first.model.modules()), "the base model is not quantized"
    initial = trainable_snapshot(first.model)
    first.train()
    assert first.state.global_step == MAX_STEPS
    assert_finite_losses(step_losses(first), range(1, MAX_STEPS + 1))
    assert moved_parameters(first.model, initial), "no trainable parameter moved"
    assert {2, 4} <= set(checkpoint_steps(output_dir)), checkpoint_steps(output_dir)
    checkpoint = output_dir / "checkpoint-4"
    assert checkpoint_global_step(checkpoint) == 4
    weights = "adapter_model.safetensors" if variant != "full" else "model.safetensors"
    assert (checkpoint / weights).is_file(), sorted(p.name for p in checkpoint.iterdir())

    # 2. A restarted job: a new trainer, same config, resumed from checkpoint-4, trains step 5.
    resumed = _build(name, variant, tiny_model_path, output_dir)
    start = trainable_snapshot(resumed.model)
    for key in initial:  # the same starting point as the first run (the checkpoint is what differs)
        torch.testing.assert_close(start[key], initial[key])
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == MAX_STEPS
    losses = step_losses(resumed)
    assert_finite_losses(losses, range(1, MAX_STEPS + 1))  # steps 1-4 come from the checkpoint's state
    assert moved_parameters(resumed.model, start), "the resumed run's trainable parameters equal the initial ones"
    # Step 5 of the resumed run is step 5 of the uninterrupted run (same data, RNG, optimizer state). QLoRA: TRL
    # casts the adapters to bfloat16 at construction, and transformers' adapter loading on resume brings them back as
    # float32 (TRL/transformers behaviour, the same with trl.GRPOTrainer): step 5 then runs in another precision, so
    # the comparisons allow bfloat16 rounding.
    qlora = variant == "qlora"
    assert losses[MAX_STEPS] == pytest.approx(
        step_losses(first)[MAX_STEPS], rel=1e-2 if qlora else 1e-4, abs=1e-4 if qlora else 1e-6
    )
    tolerance = dict(rtol=2e-2, atol=1e-3) if qlora else dict(rtol=1e-4, atol=1e-6)
    final = dict(first.model.named_parameters())
    for key, value in resumed.model.named_parameters():
        if key in initial:
            torch.testing.assert_close(
                value.float(), final[key].float(), **tolerance, msg=lambda m, k=key: f"{k}: {m}"
            )
    assert checkpoint_global_step(output_dir / f"checkpoint-{MAX_STEPS}") == MAX_STEPS
