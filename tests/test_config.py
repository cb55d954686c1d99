"""Configs: the presets carry the papers' defaults, TRL's fields are honoured or rejected, bad values fail at
construction with a message naming the field and the allowed values."""

from __future__ import annotations

import pytest
from conftest import cpu_args, digit_fraction
from trl import GRPOConfig

import trl_reasoning as tr

# (config class) -> expected resolved values, from shared/ALGORITHMS.md ("The trainers").
PAPER_DEFAULTS = {
    tr.DAPOConfig: dict(advantage_estimator="grpo", policy_loss="clip", loss_aggregation="token_mean", epsilon=0.2,
                        epsilon_high=0.28, beta=0.0, loss_type="dapo", scale_rewards="group"),
    tr.CISPOConfig: dict(advantage_estimator="grpo", policy_loss="cispo", loss_aggregation="token_mean",
                         epsilon_high=5.0, beta=0.0, loss_type="cispo", dynamic_sampling=True,
                         overlong_cache_length=102, cast_lm_head_to_fp32=True),  # 20% of TRL's 512 tokens
    tr.DPPOConfig: dict(advantage_estimator="dr_grpo", policy_loss="dppo", loss_aggregation="seq_mean_token_sum_norm",
                        dppo_divergence="binary_tv", dppo_threshold=None, dppo_is_cap=None, beta=0.0, loss_type=None),
    tr.MaxRLConfig: dict(advantage_estimator="maxrl", policy_loss="clip", loss_aggregation="token_mean", epsilon=0.2,
                         epsilon_high=None, beta=0.0, scale_rewards="none"),
    tr.RLOOConfig: dict(advantage_estimator="rloo", policy_loss="sequence_clip", loss_aggregation="seq_mean_token_sum",
                        beta=0.05, kl_in_reward=True, num_generations=2, epsilon=0.2),
    tr.DrGRPOConfig: dict(advantage_estimator="dr_grpo", policy_loss="clip", loss_aggregation="seq_mean_token_sum_norm",
                          beta=0.0, loss_type="dr_grpo", scale_rewards="none"),
    tr.ScaleRLConfig: dict(advantage_estimator="scalerl", policy_loss="cispo", loss_aggregation="prompt_mean",
                           epsilon_high=5.0, beta=0.0, zero_variance_filtering=True, positive_resampling_threshold=0.9,
                           cast_lm_head_to_fp32=True),
}  # fmt: skip


def make(config_cls=tr.ReasoningConfig, **kwargs):
    base = cpu_args()
    base.update(kwargs)
    return config_cls(**base)


@pytest.mark.parametrize("config_cls", list(PAPER_DEFAULTS), ids=lambda c: c.__name__)
def test_presets_carry_paper_defaults(config_cls):
    config = config_cls(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none")
    for name, expected in PAPER_DEFAULTS[config_cls].items():
        assert getattr(config, name) == expected, f"{config_cls.__name__}.{name}"


def test_dapo_overlong_cache_defaults_to_20_percent_of_max_length():
    assert make(tr.DAPOConfig, max_completion_length=512).overlong_cache_length == 102
    assert make(tr.DAPOConfig, max_completion_length=20480).overlong_cache_length == 4096  # the paper's setting
    assert make(tr.DAPOConfig, overlong_cache_length=None).overlong_cache_length is None
    assert make(tr.DAPOConfig, overlong_cache_length="5").overlong_cache_length == 5  # CLI strings


def test_dppo_kl_takes_its_own_default_threshold():
    from trl_reasoning.losses import DPPO_DEFAULT_THRESHOLDS

    assert DPPO_DEFAULT_THRESHOLDS["binary_tv"] == 0.15
    assert DPPO_DEFAULT_THRESHOLDS["binary_kl"] == 0.05
    assert make(tr.DPPOConfig, dppo_divergence="binary_kl").dppo_divergence == "binary_kl"


@pytest.mark.parametrize(
    ("trl_kwargs", "expected"),
    [
        ({}, ("grpo", "clip", "token_mean")),  # GRPOConfig's defaults: loss_type="dapo", scale_rewards="group"
        ({"loss_type": "grpo"}, ("grpo", "clip", "seq_mean_token_mean")),
        ({"loss_type": "dr_grpo", "scale_rewards": "none"}, ("dr_grpo", "clip", "seq_mean_token_sum_norm")),
        ({"loss_type": "cispo", "epsilon_high": 5.0}, ("grpo", "cispo", "token_mean")),
        ({"scale_rewards": "batch"}, ("batch", "clip", "token_mean")),
        ({"scale_rewards": False}, ("dr_grpo", "clip", "token_mean")),
        ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, ("grpo", "gspo", "seq_mean_token_mean")),
    ],
)
def test_trl_fields_are_honoured(trl_kwargs, expected):
    config = make(**trl_kwargs)
    assert (config.advantage_estimator, config.policy_loss, config.loss_aggregation) == expected
    GRPOConfig(**cpu_args(), **trl_kwargs)  # and TRL accepts the same arguments


@pytest.mark.parametrize(
    ("config_cls", "kwargs", "message"),
    [
        (tr.ReasoningConfig, {"advantage_estimator": "ppo"}, "Unknown advantage estimator 'ppo'. Allowed values: grpo"),
        (tr.ReasoningConfig, {"policy_loss": "sapo"}, "Unknown policy loss 'sapo'. Allowed values: clip"),
        (tr.ReasoningConfig, {"loss_aggregation": "sum"}, "Unknown loss aggregation 'sum'. Allowed values: token_mean"),
        (tr.ReasoningConfig, {"loss_type": "vespo"}, "loss_type='vespo' is not supported"),
        (tr.ReasoningConfig, {"loss_type": "bnpo"}, "loss_type='bnpo' is not supported"),
        (tr.ReasoningConfig, {"loss_type": "foo"}, "Unknown loss_type 'foo'. Allowed values: grpo, dapo"),
        (tr.DrGRPOConfig, {"loss_type": "dapo"}, "loss_aggregation='seq_mean_token_sum_norm' conflicts with loss_type"),
        (tr.CISPOConfig, {"loss_type": "dapo"}, "policy_loss='cispo' conflicts with loss_type='dapo'"),
        (tr.DAPOConfig, {"scale_rewards": "none"}, "scale_rewards='none' conflicts with advantage_estimator='grpo'"),
        (tr.MaxRLConfig, {"scale_rewards": "group"}, "scale_rewards='group' conflicts with advantage_estimator='maxrl'"),
        (tr.ReasoningConfig, {"scale_rewards": "mean"}, "Unknown scale_rewards 'mean'"),
        (tr.RLOOConfig, {"num_generations": 1, "per_device_train_batch_size": 2}, "num_generations=1 is too small"),
        (tr.DAPOConfig, {"num_generations": 1}, "num_generations=1 is too small"),
        (tr.ReasoningConfig, {"overlong_cache_length": 13}, "overlong_cache_length=13 must not exceed max_completion_length=12"),
        (tr.ReasoningConfig, {"overlong_cache_length": 0}, "overlong_cache_length must be a positive int"),
        (tr.ReasoningConfig, {"overlong_cache_length": "half"}, "overlong_cache_length must be a positive int"),
        (tr.DPPOConfig, {"dppo_threshold": -0.1}, "dppo_threshold must be >= 0"),
        (tr.DPPOConfig, {"dppo_divergence": "topk_l1"}, "Unknown dppo_divergence 'topk_l1'. Allowed values: binary_tv"),
        (tr.DPPOConfig, {"dppo_is_cap": 0.0}, "dppo_is_cap must be >= 1"),
        (tr.MaxRLConfig, {"maxrl_reward_threshold": -1.0}, "maxrl_reward_threshold must be >= 0"),
        (tr.MaxRLConfig, {"overlong_cache_length": 4}, "overlong_cache_length shapes the reward"),
        (tr.ReasoningConfig, {"epsilon_high": -0.1}, "epsilon_high must be > 0"),
        (tr.CISPOConfig, {"delta": 2.0}, "delta=2.0 (two-sided clipping) applies to policy_loss='clip' only"),
        (tr.DAPOConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence' is honoured by"),
        (tr.ReasoningConfig, {"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation="),
    ],
)  # fmt: skip
def test_invalid_values_fail_at_construction_naming_the_field(config_cls, kwargs, message):
    with pytest.raises(ValueError, match=_literal(message)):
        make(config_cls, **kwargs)


def _literal(text: str) -> str:
    import re

    return re.escape(text)


def test_trainer_rejects_a_config_of_another_class(tiny_model_path, prompts):
    with pytest.raises(TypeError, match="DAPOTrainer needs a DAPOConfig as `args`, got GRPOConfig"):
        tr.DAPOTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=GRPOConfig(**cpu_args()))


@pytest.mark.parametrize("name", ["DAPO", "CISPO", "DPPO", "MaxRL", "RLOO", "DrGRPO"])
def test_each_trainer_is_paired_with_its_config(name):
    trainer_cls, config_cls = getattr(tr, f"{name}Trainer"), getattr(tr, f"{name}Config")
    assert trainer_cls.config_class is config_cls
    assert issubclass(trainer_cls, tr.ReasoningTrainer) and issubclass(config_cls, tr.ReasoningConfig)
    assert trainer_cls._paper["id"] in (config_cls.__doc__ or "")  # the docstring cites the paper the card cites
