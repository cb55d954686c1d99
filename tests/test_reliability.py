"""The reliability matrix: bad inputs and faults, each with its expected behaviour (issue 7).

Every test here is one row of ``docs/RELIABILITY.md`` (input -> behaviour -> test id); ``test_doc_matches_tests``
keeps the two in step. A row whose behaviour the package does not have yet is a strict ``xfail`` naming what it
needs, so it turns into a failure (XPASS) the moment the behaviour lands and the mark must come off.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import io
import json
import logging
import math
import re
import shutil
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch
import trl
from conftest import (
    Recorder,
    StopAt,
    cpu_args,
    digit_fraction,
    generate_batch,
    has_digit,
    logged_metric,
    make_prompts,
    message_text,
    preset_id,
    steps_per_rollout,
)
from datasets import Dataset, IterableDataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOTrainer

import trl_reasoning as tr
from trl_reasoning.rewards.wrapping import RewardFunctionError, RewardTimeoutError
from trl_reasoning.trainer import trl_api
from trl_reasoning.trainer.checkpoints import SAMPLING_STATE_FILE

DOC = Path(__file__).parents[1] / "docs" / "RELIABILITY.md"
SECRET = "hf_SECRET123"

PRESETS = [preset_id(entry) for entry in tr.PRESETS]  # "DAPO", ..., "DrGRPO": the ids the doc's rows cite
CONFIG_CLASSES = [tr.ReasoningConfig] + [getattr(tr, f"{name}Config") for name in PRESETS]


def needs(what: str):
    """A row whose behaviour is not implemented yet: it must fail until it is (strict)."""
    return pytest.mark.xfail(strict=True, reason=f"needs: {what}")


def _trainer(model_path, tmp_path, reward_funcs, trainer_cls=tr.ReasoningTrainer, dataset=None, **overrides):
    args = trainer_cls.config_class(**cpu_args(output_dir=str(tmp_path), **overrides))
    dataset = make_prompts() if dataset is None else dataset
    return trainer_cls(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=dataset)


def _loss_on(trainer, inputs) -> torch.Tensor:
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; the loss is called directly here
    with torch.no_grad():
        return trainer._compute_loss(trainer.model, inputs)


# ====================================================================================== reward functions
# `generate_batch` scores 2 prompts x 4 completions in a fixed order: rows 0-3 are prompt "0+0=", rows 4-7 "1+7=".


def fails_on_prompt_1(prompts, completions, **kwargs):
    if any(message_text(p) == "1+7=" for p in prompts):
        raise KeyError("answer")
    return [(sum(map(ord, message_text(c))) % 11) / 10.0 for c in completions]


def infinite_reward(completions, **kwargs):
    return [float("inf")] + [0.0] * (len(completions) - 1)


def wrong_length_reward(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def text_reward(completions, **kwargs):
    return ["high"] * len(completions)


def none_instead_of_list(completions, **kwargs):
    return None


def all_none_reward(completions, **kwargs):
    return [None] * len(completions)


BAD_REWARD_OUTPUTS = [
    pytest.param(fails_on_prompt_1, r"Reward function 'fails_on_prompt_1' raised KeyError.*sample 4", id="raises"),
    pytest.param(infinite_reward, r"Reward function 'infinite_reward' returned inf for completion 0", id="inf"),
    pytest.param(
        wrong_length_reward, r"'wrong_length_reward' returned 7 rewards for 8 completions", id="wrong_length"
    ),
    pytest.param(text_reward, r"Reward function 'text_reward' returned 'high' \(str\)", id="non_number"),
    pytest.param(none_instead_of_list, r"'none_instead_of_list' returned NoneType", id="none_instead_of_list"),
]


def test_a_single_reward_function_that_scores_nothing_trains_on_like_trl(tiny_model_path, tmp_path, caplog):
    trainer = tr.DAPOTrainer(
        model=tiny_model_path,
        reward_funcs=all_none_reward,
        args=tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path), max_steps=2), dynamic_sampling=False),
        train_dataset=make_prompts(),
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.WARNING, logger="trl_reasoning.rewards.wrapping"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert "Reward function 'all_none_reward' returned None or NaN for all 8 completions" in caplog.text
    # nothing to learn from: every advantage is 0 and the parameters stay where they were
    assert set(logged_metric(trainer, "advantages/abs_mean")) == {0.0}
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


@pytest.mark.parametrize(("reward", "message"), BAD_REWARD_OUTPUTS)
def test_bad_reward_output_is_an_error_naming_the_function(reward, message, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, reward)
    with pytest.raises(tr.RewardFunctionError, match=message):
        generate_batch(trainer)


def _positional(name: str, values: list):
    def reward(completions, **kwargs):
        assert len(completions) == len(values)
        return list(values)

    reward.__name__ = name
    return reward


NAN = float("nan")
PARTIAL_REWARDS = [
    # Scored values are chosen so that no completion sits exactly at its group's mean (its advantage is nonzero).
    pytest.param([None, 0.0, 1.0, 0.25, 0.0, 1.0, 0.75, 0.5], [0], id="none_for_some"),
    pytest.param([NAN, 0.0, 1.0, 0.25, 0.0, 1.0, 0.75, 0.5], [0], id="nan_for_some"),
    pytest.param([None, None, None, None, 0.0, 1.0, 0.75, 0.5], [0, 1, 2, 3], id="all_nan_group"),
]


@pytest.mark.parametrize(("values", "excluded"), PARTIAL_REWARDS)
def test_unscorable_samples_are_excluded_without_poisoning(values, excluded, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, _positional("partial_reward", values))
    inputs = generate_batch(trainer)
    advantages = inputs["advantages"]
    assert torch.isfinite(advantages).all()
    kept = [i for i in range(8) if i not in excluded]
    assert torch.all(advantages[excluded] == 0)
    assert torch.all(advantages[kept] != 0)
    assert torch.isfinite(inputs["loss_weights"]).all()
    assert torch.isfinite(_loss_on(trainer, inputs))


def fails_on_digits(completions, **kwargs):
    """Raises on a batch holding a completion with a digit (about half of them); scores the others."""
    texts = [message_text(c) for c in completions]
    if any(ch.isdigit() for t in texts for ch in t):
        raise ValueError("cannot parse a number")
    return [(sum(map(ord, t)) % 11) / 10.0 for t in texts]


@pytest.mark.slow
def test_reward_error_exclude_trains_on(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, fails_on_digits, on_reward_error="exclude", max_steps=2)
    recorder = Recorder(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    rewards = torch.cat([b["rewards"] for b in recorder.batches])
    advantages = torch.cat([b["advantages"] for b in recorder.batches])
    failed = torch.isnan(rewards)
    assert 0 < int(failed.sum()) < rewards.numel()  # the seeded completions do hit the fault, not everywhere
    assert torch.all(advantages[failed] == 0) and torch.isfinite(advantages).all()
    errors = logged_metric(trainer, "rewards/fails_on_digits/errors")
    assert errors and sum(errors) == int(failed.sum())
    assert all(math.isfinite(loss) for loss in logged_metric(trainer, "loss"))


def graded_reward(completions, **kwargs):
    return [0.5] * len(completions)


@pytest.mark.slow
def test_maxrl_rejects_non_binary_rewards_at_train_time(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, graded_reward, trainer_cls=tr.MaxRLTrainer, max_steps=1)
    with pytest.raises(tr.RewardFunctionError, match=r"reward function 'graded_reward' returned 0\.5"):
        trainer.train()


def slow_judge(completions, **kwargs):
    time.sleep(30)  # a judge that hangs; its thread is left behind when the call times out
    return [1.0] * len(completions)


async def slow_async_judge(completions, **kwargs):
    await asyncio.sleep(30)
    return [1.0] * len(completions)


@pytest.mark.parametrize("judge", [pytest.param(slow_judge, id="sync"), pytest.param(slow_async_judge, id="async")])
def test_reward_timeout_turns_a_hung_judge_into_an_error_naming_it(judge, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, [digit_fraction, judge], reward_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RewardTimeoutError, match=rf"'{judge.__name__}' did not return within reward_timeout=0.5 s"):
        generate_batch(trainer)
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_reward_timeout_with_exclude_trains_on_without_the_judge(tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path, tmp_path, [digit_fraction, slow_judge], reward_timeout=0.3, on_reward_error="exclude"
    )
    started = time.monotonic()
    trainer.train()
    assert trainer.state.global_step == 3 and time.monotonic() - started < 25
    assert logged_metric(trainer, "rewards/slow_judge/errors") == [8.0, 8.0, 8.0]
    assert all(math.isfinite(x) for x in logged_metric(trainer, "loss"))


def signal_based_reward(completions, **kwargs) -> list[float]:
    """A reward that bounds its own parsing with SIGALRM, as math_verify's parse/verify do by default."""
    signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
    return [0.5] * len(completions)


@pytest.mark.parametrize("on_reward_error", [pytest.param(policy, id=policy) for policy in ("raise", "exclude")])
def test_reward_timeout_on_a_signal_based_reward_says_so_instead_of_excluding_everything(
    on_reward_error, tiny_model_path, tmp_path
):
    """reward_timeout runs a sync reward in a helper thread, where signals do not work: a setting to change, named as
    such, never a reward excluded sample by sample (which would train on nothing)."""
    trainer = _trainer(
        tiny_model_path, tmp_path, signal_based_reward, reward_timeout=5.0, on_reward_error=on_reward_error
    )
    with pytest.raises(RewardFunctionError, match=r"'signal_based_reward' sets a signal.*reward_timeout=None"):
        generate_batch(trainer)


class _OwnsTheReward:
    """An environment that scores its rollouts itself (TRL 1.16's `get_reward`); no reward_funcs is passed."""

    calls = 0

    def reset(self, **kwargs):
        _OwnsTheReward.calls += 1
        self.score = (_OwnsTheReward.calls * 7 % 5) / 4

    def get_reward(self) -> float:
        return self.score


def _tool_calling_model(tiny_model_path, tmp_path) -> str:
    from trl.chat_template_utils import qwen2_5_chat_template

    path = tmp_path / "tool-model"
    shutil.copytree(tiny_model_path, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template  # environments need a template that can render tool calls
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in ("ReasoningTrainer", "DAPO", "ScaleRL")])
def test_an_environment_that_owns_the_reward_trains_without_reward_funcs(name, tiny_model_path, tmp_path):
    model = _tool_calling_model(tiny_model_path, tmp_path)
    trainer_cls = tr.ReasoningTrainer if name == "ReasoningTrainer" else getattr(tr, f"{name}Trainer")
    args = trainer_cls.config_class(**cpu_args(output_dir=str(tmp_path / "out"), max_steps=2))
    trainer = trainer_cls(model=model, args=args, train_dataset=make_prompts(), environment_factory=_OwnsTheReward)
    assert trainer.reward_func_names == ["_OwnsTheReward"]
    trainer.train()
    assert trainer.state.global_step == 2 and all(math.isfinite(x) for x in logged_metric(trainer, "loss"))
    assert logged_metric(trainer, "rewards/_OwnsTheReward/mean")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", [pytest.param(kind, id=kind) for kind in ("placeholder", "environment_column")])
def test_scalerl_retires_nothing_where_the_environment_supplies_the_prompts(dataset, tiny_model_path, tmp_path):
    """Retirement is keyed by the dataset's prompt text; with TRL's placeholder rows (no train_dataset) or no prompt
    column every row would share one key, and one passing group would retire them all."""
    model = _tool_calling_model(tiny_model_path, tmp_path)
    args = tr.ScaleRLConfig(**cpu_args(output_dir=str(tmp_path / "out"), max_steps=4))
    data = None if dataset == "placeholder" else Dataset.from_list([{"environment": "a"}] * 4)
    with pytest.warns(UserWarning, match=r"the environment supplies the prompts.*No prompt is retired"):
        trainer = tr.ScaleRLTrainer(model=model, args=args, train_dataset=data, environment_factory=_AlwaysPasses)
    trainer.train()
    assert trainer.state.global_step == 4
    assert len(trainer.sampling_state_dict()["retired_prompts"]["epoch_of"]) == 0


class _AlwaysPasses(_OwnsTheReward):
    def get_reward(self) -> float:
        return 1.0


def test_no_reward_source_is_trls_error(tiny_model_path, tmp_path):
    args = tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="No reward source provided"):
        tr.DAPOTrainer(model=tiny_model_path, args=args, train_dataset=make_prompts())
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(
            model=tiny_model_path,
            args=trl.GRPOConfig(**cpu_args(output_dir=str(tmp_path))),
            train_dataset=make_prompts(),
        )


# ====================================================================================== data


@pytest.mark.slow
def test_missing_prompt_column(tiny_model_path, tmp_path):
    dataset = Dataset.from_list([{"question": f"{i}+1="} for i in range(16)])
    with pytest.raises(ValueError, match=r"'prompt'.*question"):
        _trainer(tiny_model_path, tmp_path, digit_fraction, dataset=dataset, max_steps=1).train()


def test_empty_dataset(tiny_model_path, tmp_path):
    dataset = Dataset.from_list([{"prompt": "x"}]).select([])
    with pytest.raises(ValueError, match=r"training dataset has 0 prompts, fewer than the 2 unique prompts"):
        _trainer(tiny_model_path, tmp_path, digit_fraction, dataset=dataset, max_steps=1).train()


def test_prompt_longer_than_context(tiny_model_path, tmp_path):
    # every prompt overlong: nothing would be left to train on
    dataset = Dataset.from_list([{"prompt": "7" * 600 + str(i)} for i in range(8)])
    with pytest.raises(
        ValueError, match=r"Every prompt of the train_dataset \(8\) do not fit.*max_position_embeddings"
    ):
        _trainer(tiny_model_path, tmp_path, digit_fraction, dataset=dataset, max_steps=1)


# 15 short prompts and one of 505 tokens: it fits the context (512) alone, not with max_completion_length=12.
def _one_long_prompt() -> list[dict]:
    rows = [{"prompt": f"{i}+{i}="} for i in range(15)]
    rows.insert(9, {"prompt": "7" * 505})
    return rows


@pytest.mark.slow
def test_a_prompt_that_cannot_fit_with_its_completion_is_dropped_with_a_warning_naming_it(tiny_model_path, tmp_path):
    with pytest.warns(UserWarning, match=r"1 of the 16 prompts of the train_dataset .* removed .*: #9 \(505 tokens"):
        trainer = _trainer(
            tiny_model_path, tmp_path, digit_fraction, dataset=Dataset.from_list(_one_long_prompt()), max_steps=8
        )
    assert len(trainer.train_dataset) == 15
    trainer.train()  # all the steps, as TRL trains (where transformers only warns at generation time)
    assert trainer.state.global_step == 8


def test_a_prompt_that_cannot_fit_is_an_error_naming_it_without_filtering(tiny_model_path, tmp_path):
    dataset = Dataset.from_list(_one_long_prompt())
    with pytest.raises(ValueError, match=r"#9 \(505 tokens.*set filter_overlong_prompts=True"):
        _trainer(tiny_model_path, tmp_path, digit_fraction, dataset=dataset, filter_overlong_prompts=False)


@pytest.mark.slow
def test_a_streamed_prompt_that_cannot_fit_is_skipped_with_a_warning_naming_it(tiny_model_path, tmp_path):
    rows = _one_long_prompt()
    dataset = IterableDataset.from_generator(lambda: iter(rows))
    trainer = _trainer(tiny_model_path, tmp_path, digit_fraction, dataset=dataset, max_steps=8, shuffle_dataset=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.global_step == 8
    skipped = [str(w.message) for w in caught if "(505 tokens" in str(w.message)]
    # named by its position in the stream, once however often the stream is read again (8 steps, 16 rows)
    assert len(skipped) == 1, skipped
    assert re.search(r"row 9 of the streamed train_dataset \(505 tokens: '7777.*'\) .*skipped", skipped[0])


@pytest.mark.slow
def test_tokenizer_without_pad_token_uses_eos(tiny_model_path, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.pad_token = None
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), max_steps=1))
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(),
        processing_class=tokenizer,
    )
    assert trainer.processing_class.pad_token == trainer.processing_class.eos_token == "<eos>"
    assert trainer.model.config.pad_token_id == tokenizer.eos_token_id
    trainer.train()
    assert trainer.state.global_step == 1 and all(math.isfinite(x) for x in logged_metric(trainer, "loss"))


def test_tokenizer_with_right_padding_is_left_padded_for_generation(tiny_model_path, tmp_path):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": c}]} for c in ["1=", "12345678+9="]])
    batch = [dataset[i] for i in range(2) for _ in range(4)]
    outputs = {}
    for side in ("left", "right"):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
        tokenizer.padding_side = side
        args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)))
        trainer = tr.ReasoningTrainer(
            model=tiny_model_path,
            reward_funcs=digit_fraction,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.model.train()
        torch.manual_seed(1)
        outputs[side] = trainer._generate_and_score_completions(batch)
    right = outputs["right"]
    assert right["prompt_mask"][0, 0] == 0 and right["prompt_mask"][0, -1] == 1  # the short prompt is left-padded
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(outputs["left"][key], right[key]), key


# ====================================================================================== task reward


def format_bonus(completions, **kwargs):
    """An auxiliary reward every completion earns."""
    return [1.0] * len(completions)


def never_solved(completions, **kwargs):
    """A correctness reward no completion earns."""
    return [0.0] * len(completions)


@pytest.mark.slow
def test_no_positive_resampling_with_several_rewards_needs_task_reward_funcs(tiny_model_path, tmp_path):
    # (was a ValueError at construction; TRL trains such a run, so this one trains too and retires nothing)
    with pytest.warns(
        UserWarning, match=r"task reward is ambiguous.*No prompt is retired.*task_reward_funcs=\['never_solved'\]"
    ):
        trainer = _trainer(tiny_model_path, tmp_path, [never_solved, format_bonus], tr.ScaleRLTrainer)
    trainer.train()  # format_bonus passes every completion: judged on it, every prompt would retire
    assert trainer.state.global_step == 3 and len(trainer.rollout.prompt_state.retired) == 0
    assert set(logged_metric(trainer, "group_selection/retirement_suspended")) == {1.0}


def test_task_reward_funcs_must_name_reward_functions(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"task_reward_funcs names 'correct'.*'never_solved', 'format_bonus'"):
        _trainer(
            tiny_model_path, tmp_path, [never_solved, format_bonus], tr.ScaleRLTrainer, task_reward_funcs="correct"
        )


def test_a_format_bonus_never_retires_an_unsolved_prompt(tiny_model_path, tmp_path):
    def run(task):
        trainer = _trainer(
            tiny_model_path,
            tmp_path / task,
            [never_solved, format_bonus],
            tr.ScaleRLTrainer,
            task_reward_funcs=[task],
            max_steps=2,
        )
        trainer.train()
        return trainer

    judged_on_correctness = run("never_solved")
    assert len(judged_on_correctness.rollout.prompt_state.retired) == 0
    assert set(logged_metric(judged_on_correctness, "task_reward")) == {0.0}
    assert set(logged_metric(judged_on_correctness, "reward")) == {1.0}  # the combined reward, as TRL logs it
    # the knob decides: judged on the format bonus, the same run retires every prompt it sees
    assert len(run("format_bonus").rollout.prompt_state.retired) > 0


# ====================================================================================== configs

INVALID_FIELDS = [
    # (field, value, pattern the message must match: the field's name and, for names, the allowed values)
    ("advantage_estimator", "ppo", r"advantage[_ ]estimator 'ppo'\. Allowed values: grpo, dr_grpo, rloo, maxrl"),
    (
        "policy_loss",
        "ppo",
        r"policy[_ ]loss 'ppo'\. Allowed values: clip, cispo, sapo, vespo, dppo, sequence_clip, gspo",
    ),
    ("loss_aggregation", "sum", r"loss[_ ]aggregation 'sum'\. Allowed values: token_mean, seq_mean_token_mean"),
    ("dppo_divergence", "topk_l1", r"dppo_divergence 'topk_l1'\. Allowed values: binary_tv, binary_kl, topk_tv"),
    ("dppo_threshold", -0.1, r"dppo_threshold must be >= 0"),
    ("dppo_is_cap", 0.0, r"dppo_is_cap must be >= 1"),
    ("dppo_topk", 0, r"dppo_topk must be an int >= 1"),
    ("positive_resampling_threshold", 0.0, r"positive_resampling_threshold must be in \(0, 1\]"),
    ("positive_resampling_threshold", 1.5, r"positive_resampling_threshold must be in \(0, 1\]"),
    ("max_num_gen_batches", 0, r"max_num_gen_batches must be >= 1"),
    ("epsilon", -0.1, r"epsilon must be >= 0"),
    ("overlong_cache_length", 13, r"overlong_cache_length=13 must not exceed max_completion_length=12"),
    ("overlong_cache_length", "half", r"overlong_cache_length must be a positive int, 'auto' or None"),
    # 8 completions per generation batch (GSPO's: 32, four micro-batches of 8)
    ("num_generations", 3, r"generation_batch_size \((8|32)\) must be divisible by num_generations \(3\)"),
    ("num_generations", 1, r"num_generations=1 is too small"),
]
CONFIG_ROWS = [
    pytest.param(config_cls, name, value, message, id=f"{config_cls.__name__}-{name}={value}")
    for config_cls in CONFIG_CLASSES
    for name, value, message in INVALID_FIELDS
]


@pytest.mark.parametrize(("config_cls", "name", "value", "message"), CONFIG_ROWS)
def test_invalid_config_value_names_the_field(config_cls, name, value, message):
    with pytest.raises(ValueError, match=message):
        config_cls(**cpu_args(**{name: value}))


WRONG_TYPES_AND_ORDER = [
    # (config class, kwargs, pattern naming the field(s)); values a user passes from Python by mistake
    pytest.param(tr.DAPOConfig, {"dynamic_sampling": "maybe"}, r"dynamic_sampling must be a bool", id="bool_from_text"),
    pytest.param(tr.DAPOConfig, {"epsilon_high": "high"}, r"epsilon_high must be a float", id="float_from_text"),
    pytest.param(tr.DAPOConfig, {"max_num_gen_batches": 2.5}, r"max_num_gen_batches must be an int", id="int_from_float"),
    pytest.param(tr.DAPOConfig, {"learning_rate": [1e-3]}, r"learning_rate must be a float", id="float_from_list"),
    pytest.param(tr.DAPOConfig, {"epsilon": True}, r"epsilon must be a float, got True", id="float_from_bool"),
    pytest.param(tr.DAPOConfig, {"epsilon": 0.3}, r"epsilon_high=0.28 is below epsilon=0.3", id="clip_high_below_low"),
    pytest.param(tr.ReasoningConfig, {"delta": 0.9}, r"delta=0.9 must be > 1", id="delta_below_1"),
    pytest.param(tr.ReasoningConfig, {"entropy_coef_min": 0.5, "entropy_coef_max": 0.1}, r"entropy_coef_min=0.5 is above entropy_coef_max=0.1", id="entropy_bounds"),
    pytest.param(tr.ReasoningConfig, {"temperature": 0.0}, r"temperature must be > 0", id="temperature_zero"),
    pytest.param(tr.ScaleRLConfig, {"task_reward_funcs": []}, r"task_reward_funcs must be a non-empty list", id="empty_task_rewards"),
]  # fmt: skip


@pytest.mark.parametrize(("config_cls", "kwargs", "message"), WRONG_TYPES_AND_ORDER)
def test_wrong_type_or_order_names_the_field(config_cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        config_cls(**cpu_args(**kwargs))


def test_cispo_cap_below_one_warns_and_trains_on_as_trl_accepts_it():
    # TRL takes it (its CISPO cap is epsilon_high, which defaults to epsilon = 0.2): a warning explains the absolute cap.
    with pytest.warns(UserWarning, match=r"epsilon_high=0.28 is below 1 with policy_loss='cispo'"):
        config = tr.CISPOConfig(**cpu_args(epsilon_high=0.28))
    assert config.epsilon_high == 0.28


def test_strings_convert_as_trl_yaml_parsing_does(tmp_path):
    # A YAML recipe with quoted values, parsed by TRL's own TrlParser, and the same values passed from Python.
    values = {"dynamic_sampling": "false", "epsilon_high": "0.3", "max_num_gen_batches": "4", "scale_rewards": "group"}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f'{key}: "{value}"\n' for key, value in values.items()))
    (parsed,) = trl.TrlParser((tr.DAPOConfig,)).parse_args_and_config(
        ["--config", str(recipe), "--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
    )
    built = tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path), **values))
    for key in ("dynamic_sampling", "epsilon_high", "max_num_gen_batches", "scale_rewards"):
        assert getattr(built, key) == getattr(parsed, key), key
        assert type(getattr(built, key)) is type(getattr(parsed, key)), key
    assert built.dynamic_sampling is False and built.epsilon_high == 0.3 and built.max_num_gen_batches == 4


# ====================================================================================== environment


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_use_vllm_without_vllm(tiny_model_path, tmp_path):
    with pytest.raises(ImportError, match=r"vLLM is not available.*pip install \S*vllm"):
        _trainer(tiny_model_path, tmp_path, digit_fraction, trainer_cls=tr.DAPOTrainer, use_vllm=True)


def test_qlora_without_bitsandbytes(tiny_model_path, tmp_path, monkeypatch):
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import quantizer_bnb_4bit

    monkeypatch.setattr(quantizer_bnb_4bit, "is_bitsandbytes_available", lambda *a, **k: False)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    with pytest.raises(ImportError, match=r"requires bitsandbytes: `pip install -U bitsandbytes"):
        _trainer(
            tiny_model_path,
            tmp_path,
            digit_fraction,
            trainer_cls=tr.DAPOTrainer,
            model_init_kwargs={"quantization_config": quantization, "device_map": {"": "cpu"}},
        )


def test_unsupported_trl_version_warns(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.warns(UserWarning, match=r"supports trl>=1\.16\.0,<1\.17\.0, but trl 1\.17\.0 is installed"):
        trl_api.warn_if_trl_unsupported()


def test_changed_trl_private_api_is_named():
    class NewTRL(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # completion_ids_list dropped
            return None

    with pytest.raises(tr.TRLCompatibilityError, match=r"NewTRL\._calculate_rewards takes \(inputs, prompts, comp"):
        trl_api.check_trl_private_api(NewTRL)


# ====================================================================================== training faults


class ParameterSnapshots(TrainerCallback):
    """The parameters at the start and at the end of every optimizer step."""

    def __init__(self, model):
        self.model, self.begin, self.end = model, {}, {}

    def _copy(self):
        return [p.detach().clone() for p in self.model.parameters()]

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin[state.global_step] = self._copy()

    def on_step_end(self, args, state, control, **kwargs):
        self.end[state.global_step - 1] = self._copy()


def poison_loss(trainer, steps) -> None:
    """Makes the loss of the optimizer steps in ``steps`` (0-based) NaN: NaN advantages flow through the real loss."""
    original = trainer._compute_loss

    def compute(model, inputs):
        if trainer.state.global_step in steps:
            inputs = {**inputs, "advantages": inputs["advantages"] * float("nan")}
        return original(model, inputs)

    trainer._compute_loss = compute


def test_nonfinite_loss_patience_config():
    for config_cls in CONFIG_CLASSES:
        assert config_cls(**cpu_args()).nonfinite_loss_patience == 3
    with pytest.raises(ValueError, match="nonfinite_loss_patience"):
        tr.ReasoningConfig(**cpu_args(), nonfinite_loss_patience=-1)


@pytest.mark.slow
def test_nonfinite_loss_step_is_skipped(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, digit_fraction, max_steps=3, nonfinite_loss_patience=3)
    poison_loss(trainer, steps={1})
    snapshots = ParameterSnapshots(trainer.model)
    trainer.add_callback(snapshots)
    with pytest.warns(tr.NonFiniteLossWarning, match=r"(?i)skipped optimizer step 2: its loss was NaN"):
        trainer.train()
    assert trainer.state.global_step == 3
    for a, b in zip(snapshots.begin[1], snapshots.end[1]):
        assert torch.equal(a, b)  # the skipped step left the parameters untouched
    assert any(not torch.equal(a, b) for a, b in zip(snapshots.begin[2], snapshots.end[2]))  # training went on
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert max(logged_metric(trainer, "nonfinite_loss/skipped_steps")) >= 1


@pytest.mark.slow
def test_nonfinite_loss_beyond_patience_raises(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, digit_fraction, max_steps=6, nonfinite_loss_patience=2)
    poison_loss(trainer, steps=set(range(6)))
    with (
        pytest.warns(tr.NonFiniteLossWarning) as caught,
        pytest.raises(tr.NonFiniteLossError, match=r"^3 consecutive"),
    ):
        trainer.train()
    assert sum(issubclass(w.category, tr.NonFiniteLossWarning) for w in caught) == 2  # the two steps within patience
    assert trainer.state.global_step <= 3


# ====================================================================================== resume


def _preset_run(name, model_path, output_dir, stop_at=None, resume=None):
    trainer_cls = getattr(tr, f"{name}Trainer")
    # 4 prompts, 2 a step (an epoch is 2 steps). By the checkpoint at step 4, ScaleRL has retired a prompt (in epoch
    # 1, so epoch 2 skips it) and DAPO's dynamic sampling has drawn extra prompts from its stream. A preset that trains
    # each rollout batch as several steps (GSPO: 4) takes that many times fewer completions a step, so a rollout is
    # still 2 prompts (an epoch is 2 rollouts) and the checkpoint at step 4 lies between GSPO's two rollouts.
    steps = steps_per_rollout(trainer_cls.config_class)
    trainer = _trainer(
        model_path,
        output_dir,
        has_digit,  # binary, so MaxRL takes it too
        trainer_cls=trainer_cls,
        dataset=make_prompts(4),
        max_steps=6,
        max_completion_length=8,
        per_device_train_batch_size=8 // steps,
        # ScaleRL synchronous here: with its default k = 8 every batch of this 6-step run is sampled by the initial
        # weights, which never reach the pass rate that retires a prompt (the asynchronous resume with retirement is
        # tests/journeys/test_two_processes.py's).
        **({"async_rollouts": False} if name == "ScaleRL" else {}),
    )
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in PRESETS])
def test_resume_matches_uninterrupted_run(name, tiny_model_path, tmp_path):
    full = _preset_run(name, tiny_model_path, tmp_path / "full")
    _preset_run(name, tiny_model_path, tmp_path / "split", stop_at=4)
    checkpoint = tmp_path / "split" / "checkpoint-4"
    state = json.loads((checkpoint / SAMPLING_STATE_FILE).read_text())
    if name == "ScaleRL":
        assert state["retired_prompts"]["epoch_of"]  # the resumed run must restore it to match
    if name == "DAPO":
        assert state["prompt_stream"] is not None
    resumed = _preset_run(name, tiny_model_path, tmp_path / "split", resume=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 6
    assert resumed.sampling_state_dict() == full.sampling_state_dict()
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ====================================================================================== security


def test_trust_remote_code_is_off_by_default(tiny_model_path, tmp_path, monkeypatch):
    for config_cls in CONFIG_CLASSES:
        config = config_cls(**cpu_args())
        assert config.trust_remote_code is False and config.model_init_kwargs is None
    import trl.trainer.grpo_trainer as grpo_module

    seen = []
    original = grpo_module.create_model_from_path

    def spy(model_id, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(model_id, **kwargs)

    monkeypatch.setattr(grpo_module, "create_model_from_path", spy)
    _trainer(tiny_model_path, tmp_path, digit_fraction)
    assert seen == [False]


def test_model_folder_with_custom_code_is_not_executed(tiny_model_path, tmp_path, monkeypatch):
    folder = tmp_path / "model-with-code"
    shutil.copytree(tiny_model_path, folder)
    marker = tmp_path / "EXECUTED"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.Config", "AutoModelForCausalLM": "evil.Model"}
    (folder / "config.json").write_text(json.dumps(config))

    loaded_dynamic = []
    for module_name in ("auto_factory", "configuration_auto", "tokenization_auto", "processing_auto"):
        module = importlib.import_module(f"transformers.models.auto.{module_name}")
        monkeypatch.setattr(module, "get_class_from_dynamic_module", lambda *a, **k: loaded_dynamic.append(a) or 1 / 0)
    trainer = _trainer(str(folder), tmp_path / "out", digit_fraction)
    assert type(trainer.model).__name__ == "Qwen2ForCausalLM"
    assert not loaded_dynamic and not marker.exists()


@pytest.fixture(scope="module")
def secret_run(tiny_model_path, tmp_path_factory):
    """A short DAPO run with ``hub_token`` set: a checkpoint, the final model and its card, and everything logged."""
    import transformers

    output_dir = tmp_path_factory.mktemp("secret-run")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    loggers = [logging.getLogger(), logging.getLogger("transformers"), logging.getLogger("trl")]
    for logger in loggers:
        logger.addHandler(handler)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_info()
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                args = tr.DAPOConfig(
                    **cpu_args(output_dir=str(output_dir), max_steps=2, save_strategy="steps", save_steps=2),
                    hub_token=SECRET,
                )
                trainer = tr.DAPOTrainer(
                    model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
                )
                trainer.train()
                trainer.save_model()
                trainer.create_model_card()
    finally:
        transformers.logging.set_verbosity(verbosity)
        for logger in loggers:
            logger.removeHandler(handler)
    logged = stream.getvalue() + "\n".join(str(w.message) for w in caught)
    return {"dir": output_dir, "log": logged, "args": args}


@pytest.mark.slow
def test_secret_not_in_logs(secret_run):
    assert "Running training" in secret_run["log"]  # the capture did see the Trainer's output
    assert SECRET not in secret_run["log"]


@pytest.mark.slow
def test_secret_not_in_json_or_text_outputs(secret_run):
    files = [f for f in secret_run["dir"].rglob("*") if f.is_file() and f.name != "training_args.bin"]
    names = {f.name for f in files}
    assert {"trainer_state.json", "README.md", "model.safetensors", "optimizer.pt"} <= names
    assert [str(f) for f in files if SECRET.encode() in f.read_bytes()] == []


@pytest.mark.slow
def test_secret_redacted_in_args_dict_and_json(secret_run):
    args = torch.load(secret_run["dir"] / "training_args.bin", weights_only=False)
    assert SECRET not in json.dumps(args.to_dict(), default=str)
    assert SECRET not in args.to_json_string()
    assert SECRET not in str(args)


@pytest.mark.slow
def test_secret_not_in_training_args_bin(secret_run):
    assert [str(f) for f in secret_run["dir"].rglob("training_args.bin") if SECRET.encode() in f.read_bytes()] == []


def test_secret_not_in_config_repr():
    for config_cls in CONFIG_CLASSES:
        assert SECRET not in repr(config_cls(**cpu_args(), hub_token=SECRET)), config_cls.__name__


# ====================================================================================== the matrix document


def _rows_of_this_module() -> dict[str, bool]:
    """Every test id of this module (but this one) -> whether it is a strict xfail, from the marks themselves."""
    rows = {}
    for name, func in sorted(globals().items()):
        if not (name.startswith("test_") and callable(func)) or name == "test_doc_matches_tests":
            continue
        marks = getattr(func, "pytestmark", [])
        xfail = any(m.name == "xfail" for m in marks)
        params = [m for m in marks if m.name == "parametrize"]
        if not params:
            rows[name] = xfail
            continue
        assert len(params) == 1, f"{name}: one parametrize per row table"
        for param in params[0].args[1]:
            assert param.id, f"{name}: every row needs an explicit id"
            rows[f"{name}[{param.id}]"] = xfail or any(m.name == "xfail" for m in param.marks)
    return rows


def _rows_of_the_doc() -> dict[str, bool]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 5 or not cells[-1].startswith(("`test_", "`tests/")):
            continue
        test_id = cells[-1].strip("`")
        # a test of another module may cover two rows; one of this module's is one row
        assert test_id not in rows or "::" in test_id, f"{test_id} is listed twice in {DOC.name}"
        status = cells[-2].lower()
        assert status.startswith(("passes", "xfail")), f"{test_id}: status must be 'passes' or 'xfail: ...'"
        rows[test_id] = status.startswith("xfail")
    return rows


def _test_exists_elsewhere(test_id: str) -> bool:
    """A row whose test lives in another module names it as ``path/to/test_x.py::test_name[param]``."""
    path, _, name = test_id.partition("::")
    file = Path(__file__).parents[1] / path
    return file.is_file() and f"def {name.split('[')[0]}(" in file.read_text()


def test_doc_matches_tests():
    doc, tests = _rows_of_the_doc(), _rows_of_this_module()
    elsewhere = [test_id for test_id in doc if "::" in test_id]
    assert [test_id for test_id in elsewhere if not _test_exists_elsewhere(test_id)] == []
    doc = {test_id: xfail for test_id, xfail in doc.items() if "::" not in test_id}
    assert len(tests) >= 24
    assert sorted(set(tests) - set(doc)) == [], "tests missing from docs/RELIABILITY.md"
    assert sorted(set(doc) - set(tests)) == [], "rows of docs/RELIABILITY.md without a test"
    assert {k for k, v in doc.items() if v} == {k for k, v in tests.items() if v}, "xfail status differs"
