"""Journey: evaluation during training. An eval split evaluated every 2 steps (TRL's eval loop) and pass@k every 2
steps (`PassAtKCallback`), checkpoints every 2 steps, max_steps 5: training goes on after every evaluation and every
checkpoint, and a restarted job resumed from checkpoint-2 evaluates again at step 4 and reaches the end."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import has_digit, make_prompts

from journeys._helpers import (
    MAX_STEPS,
    PRESETS,
    assert_finite_losses,
    checkpoint_global_step,
    checkpoint_steps,
    journey_args,
    rollout_args,
    step_losses,
    steps_per_rollout,
)
from trl_reasoning.evaluation.callbacks import PassAtKCallback

EVAL_STEPS = 2
NUM_SAMPLES = 4
KS = (1, 4)


def _build(name, model_path, output_dir):
    trainer_cls, config_cls, reward = PRESETS[name]
    # A rollout batch lives in memory only (TRL's buffer): a resume continues exactly from a checkpoint between two
    # rollouts. GSPO, whose rollout feeds several steps, samples every EVAL_STEPS steps here, so checkpoint-2 is one.
    rollout = rollout_args(config_cls, min(steps_per_rollout(config_cls), EVAL_STEPS))
    args = config_cls(
        **journey_args(output_dir, max_completion_length=8, **rollout), eval_strategy="steps", eval_steps=EVAL_STEPS
    )
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=reward,
        args=args,
        train_dataset=make_prompts(6),
        eval_dataset=make_prompts(4),
    )
    # pass@k judged by a binary reward (a dense reward almost never reaches success_threshold=1.0)
    callback = PassAtKCallback(
        trainer, make_prompts(4), reward_funcs=has_digit, num_samples=NUM_SAMPLES, ks=KS, eval_steps=EVAL_STEPS
    )
    trainer.add_callback(callback)
    return trainer, callback


def _entries_at(trainer, step, key) -> list[dict]:
    return [entry for entry in trainer.state.log_history if entry.get("step") == step and key in entry]


def _assert_evaluated_at(trainer, callback, steps) -> None:
    for step in steps:
        (eval_entry,) = _entries_at(trainer, step, "eval_loss")  # TRL's eval loop, exactly once per eval step
        assert math.isfinite(eval_entry["eval_loss"])
        (pass_entry,) = _entries_at(trainer, step, "eval_pass_at_k/pass@1")
        for k in KS:
            assert 0.0 <= pass_entry[f"eval_pass_at_k/pass@{k}"] <= 1.0
        assert pass_entry["eval_pass_at_k/pass@4"] >= pass_entry["eval_pass_at_k/pass@1"]
        assert 0 < pass_entry["eval_pass_at_k/mean_length"] <= 8
    assert [record["step"] for record in callback.history] == list(steps)


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRESETS))
def test_eval_and_pass_at_k_every_two_steps_then_resume(name, tiny_model_path, tmp_path):
    output_dir = tmp_path / "run"
    trainer, callback = _build(name, tiny_model_path, output_dir)
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    assert_finite_losses(step_losses(trainer), range(1, MAX_STEPS + 1))  # no training log lost to an eval log
    _assert_evaluated_at(trainer, callback, (2, 4))
    assert not _entries_at(trainer, 3, "eval_pass_at_k/pass@1") and not _entries_at(trainer, 3, "eval_loss")
    assert {2, 4} <= set(checkpoint_steps(output_dir))
    # The checkpoint taken right after an evaluation records it (the eval happened before the save).
    assert checkpoint_global_step(output_dir / "checkpoint-4") == 4

    # A restarted job resumed from checkpoint-2: it trains steps 3-5 and evaluates again at 4.
    resumed, resumed_callback = _build(name, tiny_model_path, output_dir)
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))
    assert resumed.state.global_step == MAX_STEPS
    assert_finite_losses(step_losses(resumed), range(1, MAX_STEPS + 1))
    assert [record["step"] for record in resumed_callback.history] == [4]
    (eval_entry,) = _entries_at(resumed, 4, "eval_loss")
    assert math.isfinite(eval_entry["eval_loss"])
    # Steps 3-5 of the resumed run are those of the first run.
    for step in (3, 4, 5):
        assert step_losses(resumed)[step] == pytest.approx(step_losses(trainer)[step], rel=1e-4, abs=1e-6)
    for a, b in zip(trainer.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.journey
def test_pass_at_k_metrics_do_not_collide_with_the_eval_loop(tiny_model_path, tmp_path):
    trainer, _ = _build("DAPO", tiny_model_path, tmp_path / "run")
    trainer.args.max_steps = EVAL_STEPS
    trainer.train()
    keys_by_entry = [
        {key for key in entry if key.startswith("eval_")}
        for entry in trainer.state.log_history
        if entry.get("step") == EVAL_STEPS
    ]
    pass_keys = next(keys for keys in keys_by_entry if "eval_pass_at_k/pass@1" in keys)
    loop_keys = next(keys for keys in keys_by_entry if "eval_loss" in keys)
    assert not pass_keys & loop_keys, f"logged by both at step {EVAL_STEPS}: {sorted(pass_keys & loop_keys)}"
