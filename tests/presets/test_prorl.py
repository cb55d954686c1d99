"""ProRL's preset: DAPO's recipe with the KL term kept and its reference hard-reset (the reset itself is tested in
tests/trainer/test_reference_reset.py). Its config builds with TRL's batch defaults, a generation batch the user sets
replaces its four micro-batches per rollout, and a run with its defaults trains, resetting where a rollout ends."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import cpu_args, digit_fraction, logged_metric, make_prompts

import trl_reasoning as tr


def test_prorl_builds_with_trls_batch_defaults_and_trains_each_rollout_as_four_steps():
    config = tr.ProRLConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none")
    # 8 completions a micro-batch x 4 micro-batches: 32, two groups of the paper's 16
    assert (config.per_device_train_batch_size, config.steps_per_generation) == (8, 4)
    assert (config.generation_batch_size, config.num_generations) == (32, 16)
    assert (config.beta, config.kl_in_reward, config.temperature, config.reference_reset_steps) == (
        1e-4,
        False,
        1.2,
        200,
    )
    # the clip-higher band and DAPO's loss under TRL's name
    assert (config.epsilon, config.epsilon_high, config.loss_type) == (0.2, 0.4, "dapo")


def test_a_generation_batch_size_replaces_the_four_micro_batches():
    config = tr.ProRLConfig(**cpu_args(generation_batch_size=16))
    assert (config.steps_per_generation, config.generation_batch_size) == (2, 16)
    with pytest.raises(ValueError, match="can not be both configured"):
        tr.ProRLConfig(**cpu_args(generation_batch_size=16, steps_per_generation=2))


def test_prorl_without_the_kl_term_must_turn_the_reset_off_by_name():
    with pytest.raises(ValueError, match=r"beta=0.0 trains without one .* reference_reset_steps=None"):
        tr.ProRLConfig(**cpu_args(beta=0.0))
    assert tr.ProRLConfig(**cpu_args(beta=0.0, reference_reset_steps=None)).reference_reset_steps is None


@pytest.mark.slow
def test_prorl_trains_with_its_defaults_and_resets_where_a_rollout_ends(tiny_model_path, tmp_path):
    """The preset's own settings (four optimizer steps per rollout, beta 1e-4, temperature 1.2, dynamic sampling),
    with the reset every 4 steps: the loss stays finite, the parameters move, and the reference is reset once, at
    step 4, where the first rollout batch ends."""
    args = tr.ProRLConfig(
        **cpu_args(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=5, reference_reset_steps=4)
    )
    trainer = tr.ProRLTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    losses = logged_metric(trainer, "loss")
    assert len(losses) == 5 and all(math.isfinite(loss) for loss in losses), losses
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[name], value) for name, value in before.items())
    assert logged_metric(trainer, "reference/resets") == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert logged_metric(trainer, "reference/last_reset_step") == [4.0, 4.0]
    kl = logged_metric(trainer, "kl")
    assert kl[3] > 0 and abs(kl[4]) < 1e-7, kl  # step 5 starts the next rollout from the reset reference
