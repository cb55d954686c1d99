"""A field set after its config was built (``args.x = ...``, then the trainer) is checked as construction checks it,
naming the field; a valid change takes effect with what is derived from it; the trainer's own resolution is no change."""

from __future__ import annotations

import pickle

import pytest
from conftest import cpu_args, digit_fraction, make_prompts

import trl_reasoning as tr
from trl_reasoning.utils.config_changes import CONSTRUCTION_ATTRIBUTE, changed_fields

TRAINERS = {tr.ProRLConfig: tr.ProRLTrainer, tr.DAPOConfig: tr.DAPOTrainer, tr.ReasoningConfig: tr.ReasoningTrainer}


def _build(trainer_cls, args, model_path):
    return trainer_cls(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())


@pytest.mark.parametrize(
    "config_cls,field,value,message",
    [
        (tr.ProRLConfig, "beta", 0.0, r"beta=0\.0 \(set after ProRLConfig was built\): .*reference_reset"),
        (tr.DAPOConfig, "reference_reset_steps", 1, r"reference_reset_steps=1 \(set after DAPOConfig was built\)"),
        (tr.ReasoningConfig, "ratio_anchor", "sampeler", r"ratio_anchor='sampeler' \(set after .*sampeler"),
        (tr.ReasoningConfig, "loss_type", "ppo", r"Unknown loss_type 'ppo'"),
    ],
)
def test_a_field_set_after_construction_is_refused_when_the_trainer_is_built(
    config_cls, field, value, message, tiny_model_path, tmp_path
):
    args = config_cls(**cpu_args(output_dir=str(tmp_path)))
    setattr(args, field, value)
    assert changed_fields(args) == [field]
    with pytest.raises(ValueError, match=message):
        _build(TRAINERS[config_cls], args, tiny_model_path)


def test_a_valid_change_takes_effect_with_what_derives_from_it(tiny_model_path, tmp_path):
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)))
    assert (args.policy_loss, args.loss_aggregation) == ("clip", "token_mean")
    args.loss_type = "dr_grpo"  # TRL's name: its objective and aggregation follow
    trainer = _build(tr.ReasoningTrainer, args, tiny_model_path)
    assert trainer.args is args
    assert (args.policy_loss, args.loss_aggregation) == ("clip", "seq_mean_token_sum_norm")
    assert changed_fields(args) == []


def test_the_trainers_own_resolution_is_no_change(tiny_model_path, tmp_path):
    """``async_rollouts=None`` leaves ``ratio_anchor`` to the trainer; a second trainer on the same config builds."""
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)), async_rollouts=None)
    _build(tr.ReasoningTrainer, args, tiny_model_path)
    assert args.ratio_anchor is not None and changed_fields(args) == []
    _build(tr.ReasoningTrainer, args, tiny_model_path)


def test_the_construction_arguments_never_reach_a_pickle():
    args = tr.ReasoningConfig(**cpu_args(), hub_token="hf_secret")
    assert getattr(args, CONSTRUCTION_ATTRIBUTE)[0]["hub_token"] == "hf_secret"
    restored = pickle.loads(pickle.dumps(args))
    assert not hasattr(restored, CONSTRUCTION_ATTRIBUTE) and b"hf_secret" not in pickle.dumps(args)
    assert changed_fields(restored) == []  # nothing to compare with: taken as it is
