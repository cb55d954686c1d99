"""A failing reward function is reported by name, during real training steps."""

from __future__ import annotations

from conftest import cpu_args, digit_fraction

import trl_reasoning as tr


def _trainer(path, prompts, tmp_path, reward_funcs, trainer_cls=tr.ReasoningTrainer, **kwargs):
    args = trainer_cls.config_class(**cpu_args(output_dir=str(tmp_path), max_steps=1, **kwargs))
    return trainer_cls(model=path, reward_funcs=reward_funcs, args=args, train_dataset=prompts)


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def test_all_none_function_among_several_only_warns(tiny_model_path, prompts, tmp_path, caplog):
    trainer = _trainer(tiny_model_path, prompts, tmp_path, [digit_fraction, none_reward])
    trainer.train()
    assert "Reward function 'none_reward' returned None or NaN for all 8 completions" in caplog.text


def test_maxrl_threshold_binarizes(tiny_model_path, prompts, tmp_path):
    trainer = _trainer(
        tiny_model_path, prompts, tmp_path, digit_fraction, trainer_cls=tr.MaxRLTrainer, maxrl_reward_threshold=0.2
    )
    trainer.train()  # no error: rewards >= 0.2 count as successes
