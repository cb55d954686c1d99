"""A failing reward function is reported by name, during real training steps."""

from __future__ import annotations

import pytest
from conftest import cpu_args, digit_fraction

import trl_reasoning as tr


def _trainer(path, prompts, tmp_path, reward_funcs, trainer_cls=tr.ReasoningTrainer, **kwargs):
    args = trainer_cls.config_class(**cpu_args(output_dir=str(tmp_path), max_steps=1, **kwargs))
    return trainer_cls(model=path, reward_funcs=reward_funcs, args=args, train_dataset=prompts)


def exploding_reward(completions, **kwargs):
    raise KeyError("answer")


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)


def inf_reward(completions, **kwargs):
    return [float("inf")] + [0.0] * (len(completions) - 1)


def short_reward(completions, **kwargs):
    return [1.0]


def graded_reward(completions, **kwargs):
    return [0.5] * len(completions)


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (exploding_reward, "Reward function 'exploding_reward' raised KeyError"),
        (inf_reward, "Reward function 'inf_reward' returned inf for completion 0"),
        (short_reward, "Reward function 'short_reward' returned 1 rewards for 8 completions"),
    ],
)
def test_bad_reward_function_is_named(reward, message, tiny_model_path, prompts, tmp_path):
    trainer = _trainer(tiny_model_path, prompts, tmp_path, reward)
    with pytest.raises(tr.RewardFunctionError, match=message):
        trainer.train()


def test_all_none_function_among_several_only_warns(tiny_model_path, prompts, tmp_path, caplog):
    trainer = _trainer(tiny_model_path, prompts, tmp_path, [digit_fraction, none_reward])
    trainer.train()
    assert "Reward function 'none_reward' returned None or NaN for all 8 completions" in caplog.text


def test_maxrl_names_the_non_binary_reward_function(tiny_model_path, prompts, tmp_path):
    trainer = _trainer(tiny_model_path, prompts, tmp_path, graded_reward, trainer_cls=tr.MaxRLTrainer)
    with pytest.raises(tr.RewardFunctionError, match="reward function 'graded_reward' returned 0.5"):
        trainer.train()


def test_maxrl_threshold_binarizes(tiny_model_path, prompts, tmp_path):
    trainer = _trainer(
        tiny_model_path, prompts, tmp_path, digit_fraction, trainer_cls=tr.MaxRLTrainer, maxrl_reward_threshold=0.2
    )
    trainer.train()  # no error: rewards >= 0.2 count as successes
