"""Configs: the presets carry the papers' defaults, TRL's fields are honoured or rejected, bad values fail at
construction with a message naming the field and the allowed values."""

from __future__ import annotations

import pytest
from conftest import cpu_args, digit_fraction
from trl import GRPOConfig

import trl_reasoning as tr
from trl_reasoning.presets.provenance import preset_default, preset_sources

# (config class) -> {field: (default, where it comes from)}: docs/algorithms.md ("Presets"), the papers and the
# authors' code. The source column is checked too: the preset's recorded source must cite the same place.
PRESET_DEFAULTS = {
    tr.DAPOConfig: {
        "advantage_estimator": ("grpo", "DAPO §3 Eq. 9"),
        "policy_loss": ("clip", "DAPO §3.1 Eq. 10"),
        "epsilon": (0.2, "DAPO §4.1"),
        "epsilon_high": (0.28, "DAPO §4.1"),
        "loss_aggregation": ("token_mean", "loss_agg_mode=token-mean"),  # verl code, not the paper's Eq. 12
        "overlong_cache_length": ("auto", "DAPO §3.4 Eq. 13"),
        "dynamic_sampling": (True, "DAPO §3.2 Eq. 11"),
        "max_num_gen_batches": (10, "max_num_gen_batches=10"),  # run_dapo_qwen2.5_32b.sh
        "beta": (0.0, "DAPO §2.3"),
    },
    tr.CISPOConfig: {
        "advantage_estimator": ("grpo", "MiniMax-M1 §3.1"),
        "policy_loss": ("cispo", "MiniMax-M1 §3.1 Eq. 4-5"),
        "epsilon_high": (5.0, "TRL 1.16 `GRPOConfig.epsilon_high`"),  # TRL's absolute-cap semantics
        "loss_aggregation": ("token_mean", 'TRL\'s `loss_type="cispo"`'),
        "dynamic_sampling": (True, "MiniMax-M1 §3.1"),
        "overlong_cache_length": ("auto", "MiniMax-M1 §3.1"),
        "cast_lm_head_to_fp32": (True, "MiniMax-M1 §3.2"),
        "beta": (0.0, "MiniMax-M1 §3.1"),
    },
    tr.GSPOConfig: {
        "advantage_estimator": ("grpo", "GSPO §4.1 Eq. 6"),
        "policy_loss": ("gspo", "GSPO §4.1 Eq. 5 and 7"),
        "epsilon": (3e-4, "GSPO §5.1"),
        "epsilon_high": (4e-4, "GSPO §5.1"),
        "loss_aggregation": ("seq_mean_token_mean", 'TRL\'s paper index `loss_type="grpo"`'),
        "beta": (0.0, "GSPO §4.1 Eq. 5"),
        "gradient_accumulation_steps": (1, "TRL's paper index `gradient_accumulation_steps=1`"),
        "steps_per_generation": (4, "GSPO §5.1"),
    },
    tr.ProRLConfig: {
        "advantage_estimator": ("grpo", "ProRL §2.1"),
        "policy_loss": ("clip", "ProRL §2.2, 'Mitigating Entropy Collapse'"),
        "epsilon": (0.2, "ε_low = 0.2"),
        "epsilon_high": (0.4, "ε_high = 0.4"),
        "loss_aggregation": ("token_mean", "token-level policy-gradient loss"),
        "dynamic_sampling": (True, "DAPO's dynamic sampling"),
        "temperature": (1.2, "rollout temperature 1.2"),
        "num_generations": (16, "16 responses sampled per prompt"),
        "beta": (1e-4, "β = 1e-4"),
        "steps_per_generation": (4, "four updates per rollout"),
        "lr_scheduler_type": ("constant", "constant learning rate"),
        "reference_reset_steps": (200, "'KL Regularization and Reference Policy Reset'"),  # 200: ProRL v2's low end
    },
    tr.DPPOConfig: {
        "advantage_estimator": ("dr_grpo", "norm_adv_by_std_in_grpo=False"),  # run_qwen30b_dppo.sh
        "policy_loss": ("dppo", "DPPO §4.3 Eq. 12"),
        "dppo_divergence": ("binary_tv", "DPPO §4.4"),
        "dppo_threshold": (None, "DPPO App. C.1"),
        "dppo_topk": (20, "DPPO §7.3"),
        "dppo_is_cap": (None, "clip_ratio_c=10000"),
        "loss_aggregation": ("seq_mean_token_sum_norm", "loss_agg_mode=seq-mean-token-sum-norm"),
        "beta": (0.0, "use_kl_loss=False"),
    },
    tr.MaxRLConfig: {
        "advantage_estimator": ("maxrl", "MaxRL Algorithm 1"),
        "policy_loss": ("clip", "MaxRL appendix"),
        "epsilon": (0.2, "CLIP_RATIO_LOW=CLIP_RATIO_HIGH=0.2"),
        "loss_aggregation": ("token_mean", "loss_agg_mode: token-mean"),
        "beta": (0.0, "KL coefficient 0"),
    },
    tr.RLOOConfig: {
        "advantage_estimator": ("rloo", "§2.3"),
        "policy_loss": ("sequence_clip", "TRL 1.16 `rloo_trainer.py`"),
        "epsilon": (0.2, "`RLOOConfig.epsilon`"),
        "loss_aggregation": ("seq_mean_token_sum", "TRL 1.16 `rloo_trainer.py`"),
        "kl_in_reward": (True, "TRL 1.16 `rloo_trainer.py`"),
        "beta": (0.05, "`RLOOConfig.beta`"),
        "num_generations": (2, "`RLOOConfig.num_generations`"),
    },
    tr.ReinforcePPConfig: {
        "advantage_estimator": ("reinforce_pp_baseline", "--algo.advantage.estimator reinforce_baseline"),
        "policy_loss": ("clip", "`PolicyLoss`"),
        "epsilon": (0.2, "`--actor.eps_clip` default 0.2"),
        "loss_aggregation": ("token_mean", "`token_level_loss=True`"),
        "beta": (0.01, "`--algo.kl.init_coef` default 0.01"),
    },
    tr.DrGRPOConfig: {
        "advantage_estimator": ("dr_grpo", "Dr. GRPO §3.2"),
        "policy_loss": ("clip", "Dr. GRPO §3.2"),
        "epsilon": (0.2, "Dr. GRPO App. G Table 6"),
        "loss_aggregation": ("seq_mean_token_sum_norm", "generate_max_length"),  # the authors' code
        "beta": (0.0, "Dr. GRPO App. G Table 6"),
    },
    tr.ScaleRLConfig: {
        "advantage_estimator": ("scalerl", "ScaleRL §3.2"),
        "policy_loss": ("cispo", "ScaleRL §3.2"),
        "epsilon_high": (5.0, "ScaleRL App. A.17.2"),
        "loss_aggregation": ("prompt_mean", "ScaleRL §3.2"),
        "zero_variance_filtering": (True, "ScaleRL §3.2"),
        "positive_resampling_threshold": (0.9, "ScaleRL §3.2"),
        "cast_lm_head_to_fp32": (True, "ScaleRL §3.2"),
        "beta": (0.0, "ScaleRL §4"),
        "async_rollouts": (None, "ScaleRL §3.1"),
        "max_staleness": (8, "ScaleRL §3.1"),
    },
}

# Values every preset derives in __post_init__ (TRL-compatibility mirrors and resolved "auto"s), not sourced fields.
DERIVED_DEFAULTS = {
    tr.DAPOConfig: dict(loss_type="dapo", scale_rewards="group", overlong_cache_length=102),
    tr.CISPOConfig: dict(loss_type="cispo", overlong_cache_length=102),  # 20% of TRL's 512 tokens
    # TRL's documented GSPO recipe: its loss_type and sequence-level ratio; 8 completions x 4 micro-batches per rollout
    tr.GSPOConfig: dict(loss_type="grpo", importance_sampling_level="sequence", generation_batch_size=32),
    # DAPO's loss under TRL's name; 8 completions x 4 micro-batches per rollout (2 prompts of 16)
    tr.ProRLConfig: dict(loss_type="dapo", scale_rewards="group", generation_batch_size=32, kl_in_reward=False),
    tr.DPPOConfig: dict(loss_type=None),
    tr.MaxRLConfig: dict(scale_rewards="none", epsilon_high=None),
    tr.DrGRPOConfig: dict(loss_type="dr_grpo", scale_rewards="none"),
    # the clip with token_mean is TRL's loss_type="dapo"; no KL twice, no second normalisation
    tr.ReinforcePPConfig: dict(loss_type="dapo", scale_rewards="none", kl_in_reward=False, normalize_advantages=False),
}


def make(config_cls=tr.ReasoningConfig, **kwargs):
    base = cpu_args()
    base.update(kwargs)
    return config_cls(**base)


@pytest.mark.parametrize("config_cls", list(PRESET_DEFAULTS), ids=lambda c: c.__name__)
def test_presets_carry_paper_defaults_with_their_sources(config_cls):
    recorded = preset_sources(config_cls)
    assert set(recorded) == set(PRESET_DEFAULTS[config_cls]), "a sourced default is missing from one of the two tables"
    for name, (value, cited) in PRESET_DEFAULTS[config_cls].items():
        default, source = recorded[name]
        assert default == value, f"{config_cls.__name__}.{name}"
        assert cited in source, f"{config_cls.__name__}.{name}: source {source!r} does not cite {cited!r}"
        assert f"`{name}={value!r}`: {source}" in config_cls.__doc__  # help(config_cls) shows it


@pytest.mark.parametrize("config_cls", list(PRESET_DEFAULTS), ids=lambda c: c.__name__)
def test_presets_resolve_to_paper_defaults(config_cls):
    config = config_cls(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none")
    expected = {name: value for name, (value, _) in PRESET_DEFAULTS[config_cls].items()}
    expected.update(DERIVED_DEFAULTS.get(config_cls, {}))
    for name, value in expected.items():
        assert getattr(config, name) == value, f"{config_cls.__name__}.{name}"


def test_every_preset_has_its_expected_defaults_here():
    assert list(PRESET_DEFAULTS) == [entry.config_class for entry in tr.PRESETS], "PRESET_DEFAULTS misses a preset"


def test_a_preset_default_without_a_source_is_refused():
    with pytest.raises(ValueError, match="needs a source"):
        preset_default("beta", 0.1, source=" ")


def test_dapo_overlong_cache_defaults_to_20_percent_of_max_length():
    assert make(tr.DAPOConfig, max_completion_length=512).overlong_cache_length == 102
    assert make(tr.DAPOConfig, max_completion_length=20480).overlong_cache_length == 4096  # the paper's setting
    assert make(tr.DAPOConfig, overlong_cache_length=None).overlong_cache_length is None
    assert make(tr.DAPOConfig, overlong_cache_length="5").overlong_cache_length == 5  # CLI strings


def test_gspo_trains_each_rollout_as_four_steps_unless_a_generation_batch_size_is_set():
    default = make(tr.GSPOConfig)  # cpu_args: 8 completions a micro-batch
    assert (default.steps_per_generation, default.generation_batch_size) == (4, 32)
    # TRL refuses both fields together; the preset's 4 gives way to a generation batch the user sets
    config = make(tr.GSPOConfig, generation_batch_size=16)
    assert (config.steps_per_generation, config.generation_batch_size) == (2, 16)
    with pytest.raises(ValueError, match="can not be both configured"):
        make(tr.GSPOConfig, generation_batch_size=16, steps_per_generation=2)


@pytest.mark.parametrize(
    ("config_class", "loss_type", "field", "value"),
    [
        (tr.GSPOConfig, "dapo", "loss_aggregation", "seq_mean_token_mean"),
        (tr.ReinforcePPConfig, "grpo", "loss_aggregation", "token_mean"),
        (tr.CISPOConfig, "dapo", "policy_loss", "cispo"),
    ],
)
def test_a_loss_type_against_a_preset_default_says_the_preset_set_it(config_class, loss_type, field, value):
    """The user passed loss_type only: the conflicting field is the preset's default, and the way out is to clear it."""
    with pytest.raises(ValueError, match=rf"pass {field}=None to take loss_type's \({field}='{value}' is "
                       rf"{config_class.__name__}'s default\)"):  # fmt: skip
        make(config_class, loss_type=loss_type)
    config = make(config_class, loss_type=loss_type, **{field: None})
    assert config.loss_type == loss_type
    with pytest.raises(ValueError, match=rf"or drop {field}\."):  # a value the user set: no such hint
        make(tr.ReasoningConfig, loss_type=loss_type, **{field: value})


@pytest.mark.parametrize("config_class", [tr.GSPOConfig, tr.ProRLConfig])
def test_four_updates_per_rollout_follow_gradient_accumulation_unless_steps_are_passed(config_class):
    """The papers' four optimizer steps per rollout batch are the preset's default, counted in optimizer steps: TRL's
    micro-batches scale with gradient accumulation. A value the user passes is TRL's micro-batches, kept as given."""
    extra = {"num_generations": 8} if config_class is tr.ProRLConfig else {}
    accumulated = make(config_class, gradient_accumulation_steps=4, **extra)
    assert (accumulated.steps_per_generation, accumulated.generation_batch_size) == (16, 128)
    assert type(accumulated.steps_per_generation) is int
    explicit = make(config_class, gradient_accumulation_steps=4, steps_per_generation=4, **extra)
    assert explicit.steps_per_generation == 4  # one optimizer step per rollout batch, as asked
    assert (
        make(config_class, gradient_accumulation_steps=4, generation_batch_size=64, **extra).steps_per_generation == 8
    )
    with pytest.raises(ValueError, match="can not be both configured"):  # TRL's refusal, also for the value 4
        make(config_class, generation_batch_size=64, steps_per_generation=4, **extra)
    # the field's default reads as the paper's number (docs tables, --help)
    assert repr(config_class.__dataclass_fields__["steps_per_generation"].default) == "4"


@pytest.mark.parametrize("generator", ["process", "server"])
def test_a_generator_that_samples_ahead_refuses_the_four_updates_at_construction(generator):
    vllm = {"use_vllm": True, "vllm_mode": "server"} if generator == "server" else {}
    with pytest.raises(
        ValueError,
        match=rf"async_generator='{generator}' does not support more or less than one .*"
        r"GSPOConfig has steps_per_generation=4, num_iterations=1 and gradient_accumulation_steps=1",
    ):
        make(tr.GSPOConfig, async_rollouts=True, async_generator=generator, **vllm)
    with pytest.raises(ValueError, match=r"steps_per_generation=2, num_iterations=2"):
        make(tr.ReasoningConfig, async_rollouts=True, async_generator=generator, steps_per_generation=2,
             gradient_accumulation_steps=2, num_iterations=2, **vllm)  # fmt: skip
    config = make(tr.GSPOConfig, async_rollouts=True, async_generator=generator, steps_per_generation=1, **vllm)
    assert config.steps_per_generation == 1
    # async_rollouts=None leaves an unsupported run to the trainer (synchronous, with a warning)
    assert make(tr.GSPOConfig, async_rollouts=None, async_generator=generator, **vllm).steps_per_generation == 4


def test_dppo_kl_takes_its_own_default_threshold():
    from trl_reasoning.algorithms.losses import DPPO_DEFAULT_THRESHOLDS

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
        ({"loss_type": "dapo", "importance_sampling_level": "sequence"}, ("grpo", "gspo", "token_mean")),
        ({"loss_type": "bnpo"}, ("grpo", "clip", "micro_batch_token_mean")),
        ({"loss_type": "sapo"}, ("grpo", "sapo", "seq_mean_token_mean")),
        ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, ("grpo", "gspo", "seq_mean_token_sum")),
        ({"loss_type": "luspo"}, ("grpo", "clip", "seq_mean_token_sum")),
        ({"loss_type": "vespo"}, ("grpo", "vespo", "token_mean")),
        (
            {"loss_type": "cispo", "epsilon_high": 5.0, "importance_sampling_level": "sequence"},
            ("grpo", "cispo", "token_mean"),
        ),
        ({"multi_objective_aggregation": "normalize_then_sum"}, ("batch_zscore", "clip", "token_mean")),
        (
            {"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "group"},
            ("batch_zscore", "clip", "token_mean"),
        ),
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
        (tr.ReasoningConfig, {"policy_loss": "ppo"}, "Unknown policy loss 'ppo'. Allowed values: clip"),
        (tr.ReasoningConfig, {"loss_aggregation": "sum"}, "Unknown loss aggregation 'sum'. Allowed values: token_mean"),
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
        (tr.DPPOConfig, {"delta": 2.0}, "delta=2.0 (two-sided clipping) applies to policy_loss='clip' (and 'gspo') only"),
        (tr.DPPOConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence' takes one importance ratio per sequence, which policy_loss='dppo'"),
        (tr.ReasoningConfig, {"importance_sampling_level": "batch"}, "Unknown importance_sampling_level 'batch'"),
        (tr.ReasoningConfig, {"multi_objective_aggregation": "average"}, "Unknown multi_objective_aggregation 'average'"),
        (tr.MaxRLConfig, {"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation shapes the reward"),
        (tr.RLOOConfig, {"reward_clip_range": (2.0, 1.0)}, "reward_clip_range=(min, max) needs min <= max"),
        (tr.RLOOConfig, {"reward_clip_range": (1.0,)}, "reward_clip_range must be a pair"),
        (tr.ReasoningConfig, {"reward_timeout": 0.0}, "reward_timeout must be > 0 seconds"),
        (tr.ScaleRLConfig, {"task_pass_threshold": float("nan")}, "task_pass_threshold must be a finite number"),
        (tr.ReinforcePPConfig, {"kl_in_reward": True}, "kl_in_reward=True subtracts beta's KL from the sequence reward, but advantage_estimator='reinforce_pp_baseline' already"),
        (tr.ReinforcePPConfig, {"advantage_estimator": "reinforce_pp", "kl_in_reward": True}, "the KL would count twice. Set kl_in_reward=False"),
        (tr.ReinforcePPConfig, {"normalize_advantages": True}, "normalize_advantages=True standardises the advantages per completion"),
        (tr.ReinforcePPConfig, {"beta": -0.01}, "beta must be >= 0 with advantage_estimator='reinforce_pp_baseline'"),
        (tr.ReasoningConfig, {"advantage_estimator": "reinforce_pp", "kl_in_reward": True, "beta": 0.05}, "kl_in_reward=True subtracts"),
    ],
)  # fmt: skip
def test_invalid_values_fail_at_construction_naming_the_field(config_cls, kwargs, message):
    with pytest.raises(ValueError, match=_literal(message)):
        make(config_cls, **kwargs)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_delta_with_a_loss_type_trl_runs_without_it_is_accepted_and_ignored_as_in_trl(loss_type):
    """TRL accepts `delta` with these loss types and leaves it out of their loss; so does ReasoningConfig (with a
    warning), and the policy loss is not given it."""
    GRPOConfig(**cpu_args(loss_type=loss_type, delta=2.0))  # TRL's own config accepts it
    with pytest.warns(UserWarning, match=rf"delta=2.0 .* is ignored by policy_loss='{loss_type}'"):
        config = make(tr.ReasoningConfig, loss_type=loss_type, delta=2.0)
    assert config.policy_loss == loss_type and config.delta == 2.0
    from trl_reasoning.algorithms.losses import POLICY_LOSSES

    assert "delta" not in POLICY_LOSSES.kwargs_for(loss_type, {"delta": 2.0})


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


def test_a_preset_s_own_group_size_is_named_when_the_batch_does_not_divide_by_it(tmp_path):
    """ProRL samples 16 completions per prompt where GRPOConfig samples 8: a batch that suits GRPOConfig fails TRL's
    divisibility check with a group size the user never set, so the error says whose default it is and the way out;
    a group size the user did set keeps TRL's message."""
    common = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, generation_batch_size=24)
    GRPOConfig(**common)  # TRL accepts this batch with its own group size
    with pytest.raises(ValueError, match="num_generations=16 is ProRLConfig's default") as caught:
        tr.ProRLConfig(**common)
    assert "must be divisible by num_generations (16)" in str(caught.value)
    with pytest.raises(ValueError) as chosen:
        tr.ProRLConfig(**common, num_generations=5)
    assert "default" not in str(chosen.value)
    with pytest.raises(ValueError, match="divisible by num_generations") as dapo:
        tr.DAPOConfig(**{**common, "generation_batch_size": 16}, num_generations=6)
    assert "default" not in str(dapo.value)
