"""Where trl-reasoning's math coincides with TRL's, both trainers must give the same advantages, loss and gradients.

Both trainers load the same tiny model, generate the same completions (same seed), and are compared on:
the advantages of the generated batch, the loss, and every parameter's gradient, both on-policy (ratio 1) and with
perturbed behaviour log-probabilities so that clipping and capping are exercised.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch, logged_metric, make_prompts
from trl import GRPOConfig, GRPOTrainer
from trl import RLOOConfig as TRLRLOOConfig
from trl import RLOOTrainer as TRLRLOOTrainer

import trl_reasoning as tr

TOLERANCE = dict(rtol=1e-5, atol=1e-7)
#: Packed forwards (``padding_free``, the default) sum in another order than TRL's padded ones: gradients agree to
#: float32 rounding of the whole step, not of each element.
PACKED_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _loss_and_grads(trainer, inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.model.parameters()]
    return loss.detach(), grads


def _perturbed_old_logps(trainer, inputs: dict, seed: int = 7) -> torch.Tensor:
    """Behaviour log-probs a little off the current policy, so ratios leave the clip range."""
    current = trainer.behaviour_logps(inputs)
    generator = torch.Generator().manual_seed(seed)
    return current + 0.4 * torch.randn(current.shape, generator=generator)


def _assert_same(
    ours,
    theirs,
    ours_inputs,
    their_inputs,
    their_old_key="old_per_token_logps",
    off_policy_tolerance=None,
    tolerance_on_policy=TOLERANCE,
):
    """Same advantages; same loss and gradients on-policy and with perturbed behaviour log-probs.

    `their_old_key` names where TRL's trainer reads the behaviour log-probs: per token (`GRPOTrainer`), or summed over
    the completion (`RLOOTrainer`'s "old_logps").
    """
    torch.testing.assert_close(ours_inputs["advantages"], their_inputs["advantages"], **TOLERANCE)
    for off_policy in (False, True):
        tolerance = tolerance_on_policy
        if off_policy:
            old = _perturbed_old_logps(ours, ours_inputs)
            their_old = (
                old if their_old_key == "old_per_token_logps" else (old * their_inputs["completion_mask"]).sum(1)
            )
            ours_inputs = {**ours_inputs, "old_per_token_logps": old}
            their_inputs = {**their_inputs, their_old_key: their_old}
            tolerance = off_policy_tolerance or tolerance_on_policy
        loss_ours, grads_ours = _loss_and_grads(ours, ours_inputs)
        loss_theirs, grads_theirs = _loss_and_grads(theirs, their_inputs)
        assert torch.isfinite(loss_ours)
        torch.testing.assert_close(loss_ours, loss_theirs, **tolerance)
        for g_ours, g_theirs in zip(grads_ours, grads_theirs, strict=True):
            torch.testing.assert_close(g_ours, g_theirs, **tolerance)
        assert any(g.abs().sum() > 0 for g in grads_ours), "the comparison is vacuous: no gradient"


CASES = {
    # preset (no overlong shaping) vs the TRL loss_type with the same math
    "dapo": (
        tr.DAPOTrainer,
        tr.DAPOConfig,
        {"overlong_cache_length": None},
        {"loss_type": "dapo", "epsilon_high": 0.28},
    ),
    # the CISPO objective alone: MiniMax-M1's recipe around it (dynamic sampling, overlong shaping, FP32 head) off
    "cispo": (
        tr.CISPOTrainer,
        tr.CISPOConfig,
        {"dynamic_sampling": False, "overlong_cache_length": None, "cast_lm_head_to_fp32": False},
        {"loss_type": "cispo", "epsilon_high": 5.0},
    ),
    "dr_grpo": (tr.DrGRPOTrainer, tr.DrGRPOConfig, {}, {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    # the base config honours TRL's own fields
    "grpo": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "grpo"}, {"loss_type": "grpo"}),
    "gspo": (
        tr.ReasoningTrainer,
        tr.ReasoningConfig,
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    ),
    "batch_scaling": (tr.ReasoningTrainer, tr.ReasoningConfig, {"scale_rewards": "batch"}, {"scale_rewards": "batch"}),
    "dapo_kl": (
        tr.DAPOTrainer,
        tr.DAPOConfig,
        {"overlong_cache_length": None, "beta": 0.1},
        {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.1},
    ),
    "two_sided_clip": (tr.ReasoningTrainer, tr.ReasoningConfig, {"delta": 1.5}, {"delta": 1.5}),
    # every other TRL 1.16 loss_type, and the sequence-level ratio on the losses that sum tokens
    "bnpo": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "bnpo"}, {"loss_type": "bnpo"}),
    "sapo": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "sapo"}, {"loss_type": "sapo"}),
    "sapo_temperatures": (
        tr.ReasoningTrainer,
        tr.ReasoningConfig,
        {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5},
        {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5},
    ),
    "luspo": (
        tr.ReasoningTrainer,
        tr.ReasoningConfig,
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    ),
    "luspo_token": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "luspo"}, {"loss_type": "luspo"}),
    "vespo": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "vespo"}, {"loss_type": "vespo"}),
    "vespo_custom": (
        tr.ReasoningTrainer,
        tr.ReasoningConfig,
        {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5},
        {"loss_type": "vespo", "vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5},
    ),
    "dapo_sequence": (
        tr.DAPOTrainer,
        tr.DAPOConfig,
        {"overlong_cache_length": None, "importance_sampling_level": "sequence"},
        {"loss_type": "dapo", "epsilon_high": 0.28, "importance_sampling_level": "sequence"},
    ),
    "cispo_sequence": (
        tr.ReasoningTrainer,
        tr.ReasoningConfig,
        {"loss_type": "cispo", "epsilon_high": 5.0, "importance_sampling_level": "sequence"},
        {"loss_type": "cispo", "epsilon_high": 5.0, "importance_sampling_level": "sequence"},
    ),
    "dr_grpo_sequence": (
        tr.DrGRPOTrainer,
        tr.DrGRPOConfig,
        {"importance_sampling_level": "sequence"},
        {"loss_type": "dr_grpo", "scale_rewards": "none", "importance_sampling_level": "sequence"},
    ),
    "cispo_default_cap": (tr.ReasoningTrainer, tr.ReasoningConfig, {"loss_type": "cispo"}, {"loss_type": "cispo"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_trl_grpo_trainer(case, tiny_model_path, tmp_path):
    """With TRL's padded forwards (``padding_free=False``) exactly; packed (the default) to float32 rounding."""
    trainer_cls, config_cls, ours_kwargs, trl_kwargs = CASES[case]
    dataset = make_prompts()
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=GRPOConfig(**cpu_args(output_dir=str(tmp_path / "trl"), **trl_kwargs)),
        train_dataset=dataset,
    )
    their_inputs = None
    for padding_free, tolerance in ((False, TOLERANCE), (None, PACKED_TOLERANCE)):
        ours = trainer_cls(
            model=tiny_model_path,
            reward_funcs=digit_fraction,
            args=config_cls(**cpu_args(output_dir=str(tmp_path / "ours"), padding_free=padding_free, **ours_kwargs)),
            train_dataset=dataset,
        )
        assert ours.packing.enabled == (padding_free is None)
        if "beta" in ours_kwargs:  # move the policy off the reference so that the KL term is not zero
            _perturb_both(ours.model, *(() if their_inputs is not None else (theirs.model,)))
        ours_inputs = generate_batch(ours)
        their_inputs = generate_batch(theirs) if their_inputs is None else their_inputs
        torch.testing.assert_close(ours_inputs["completion_ids"], their_inputs["completion_ids"], rtol=0, atol=0)
        _assert_same(ours, theirs, ours_inputs, their_inputs, tolerance_on_policy=tolerance)


def _perturb_both(*models, seed: int = 3):
    for params in zip(*(m.parameters() for m in models), strict=True):
        noise = 0.05 * torch.randn(params[0].shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            for p in params:
                p.add_(noise)


# TRL's RLOOTrainer takes the sequence log-ratio as the difference of two float32 sums of ~50 log-probs
# (sum(log pi) - sum(log pi_old)); trl-reasoning sums the per-token differences, which rounds less. The same math,
# summed in another order: float32 sums of magnitude ~50 differ by ~1e-5, hence this looser absolute tolerance.
RLOO_TOLERANCE = dict(rtol=1e-4, atol=2e-6)


def test_rloo_matches_trl_rloo_trainer(tiny_model_path, tmp_path):
    """Leave-one-out advantages with the KL penalty in the reward, sequence-ratio clip, mean over sequences."""
    dataset = make_prompts()
    common = cpu_args(num_generations=4, beta=0.05)
    ours = tr.RLOOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.RLOOConfig(**{**common, "output_dir": str(tmp_path / "ours")}),
        train_dataset=dataset,
    )
    theirs = TRLRLOOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=TRLRLOOConfig(**{**common, "output_dir": str(tmp_path / "trl")}),
        train_dataset=dataset,
    )
    _perturb_both(ours.model, theirs.model)  # policy != reference, so the KL penalty is not zero
    ours_inputs, their_inputs = generate_batch(ours), generate_batch(theirs)
    torch.testing.assert_close(ours_inputs["completion_ids"], their_inputs["completion_ids"], rtol=0, atol=0)
    assert ours.args.kl_in_reward and ours.beta == 0.05
    _assert_same(
        ours, theirs, ours_inputs, their_inputs, their_old_key="old_logps", off_policy_tolerance=RLOO_TOLERANCE
    )


def _first_char_is_digit(completions, **kwargs) -> list[float]:
    """A second reward on another scale than digit_fraction (0 or 3), so normalize_then_sum differs from summing."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [3.0 if t[:1].isdigit() else 0.0 for t in texts]


@pytest.mark.parametrize("weights", [None, [1.0, 0.5]])
def test_normalize_then_sum_matches_trl(weights, tiny_model_path, tmp_path):
    """TRL's multi_objective_aggregation="normalize_then_sum": each reward function standardised within its group,
    weighted sum, then standardised over the batch; TRL ignores scale_rewards there, and so does the config."""
    dataset = make_prompts()
    funcs = [digit_fraction, _first_char_is_digit]
    common = {"multi_objective_aggregation": "normalize_then_sum", "reward_weights": weights}
    ours = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=funcs,
        args=tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path / "ours"), **common)),
        train_dataset=dataset,
    )
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=funcs,
        args=GRPOConfig(**cpu_args(output_dir=str(tmp_path / "trl"), **common)),
        train_dataset=dataset,
    )
    ours_inputs, their_inputs = generate_batch(ours), generate_batch(theirs)
    torch.testing.assert_close(ours_inputs["completion_ids"], their_inputs["completion_ids"], rtol=0, atol=0)
    assert ours_inputs["advantages"].abs().sum() > 0
    _assert_same(ours, theirs, ours_inputs, their_inputs)


@pytest.mark.parametrize(
    "options",
    [
        {"normalize_advantages": True},
        {"reward_clip_range": (0.1, 0.4)},
        {"normalize_advantages": True, "reward_clip_range": (0.0, 0.3)},
    ],
)
def test_rloo_options_of_trl_rloo_config_match_trl(options, tiny_model_path, tmp_path):
    """The two fields of TRL's RLOOConfig that trl-reasoning's RLOOConfig lacked: advantage normalisation over the
    batch and reward clipping (before the KL penalty), each honoured as TRL's RLOOTrainer does."""
    dataset = make_prompts()
    common = cpu_args(num_generations=4, beta=0.05, **options)
    ours = tr.RLOOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.RLOOConfig(**{**common, "output_dir": str(tmp_path / "ours")}),
        train_dataset=dataset,
    )
    theirs = TRLRLOOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=TRLRLOOConfig(**{**common, "output_dir": str(tmp_path / "trl")}),
        train_dataset=dataset,
    )
    _perturb_both(ours.model, theirs.model)
    ours_inputs, their_inputs = generate_batch(ours), generate_batch(theirs)
    torch.testing.assert_close(ours_inputs["completion_ids"], their_inputs["completion_ids"], rtol=0, atol=0)
    # Standardised advantages are a few times larger than raw ones, and so is the float32 rounding of the sequence
    # log-ratio sums (see RLOO_TOLERANCE) in the gradients.
    tolerance = dict(RLOO_TOLERANCE, atol=1e-5) if options.get("normalize_advantages") else RLOO_TOLERANCE
    _assert_same(ours, theirs, ours_inputs, their_inputs, their_old_key="old_logps", off_policy_tolerance=tolerance)


def test_every_field_of_trl_rloo_config_exists_in_ours():
    ours = {f.name for f in dataclasses.fields(tr.RLOOConfig)}
    theirs = {f.name for f in dataclasses.fields(TRLRLOOConfig)}
    assert theirs - ours == set()


@pytest.mark.parametrize("loss_type", ["bnpo", "luspo", "sapo", "vespo", "dapo", "grpo"])
def test_a_training_step_with_gradient_accumulation_matches_trl(loss_type, tiny_model_path, tmp_path):
    """A whole optimizer step (generation, two accumulated micro-batches, the update) with TRL's loss_type gives the
    same parameters as GRPOTrainer: bnpo's per-micro-batch normaliser and every loss's accumulation scaling included.
    Plain SGD, so that the parameters move by the gradient itself (Adam's first step is lr * sign(g), which turns
    float32 noise on a near-zero gradient into a full step)."""
    dataset = make_prompts()
    common = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=1,
        loss_type=loss_type,
        epsilon_high=0.3,
        optim="sgd",
        learning_rate=1.0,
    )
    ours = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path / "ours"), **common)),
        train_dataset=dataset,
    )
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=GRPOConfig(**cpu_args(output_dir=str(tmp_path / "trl"), **common)),
        train_dataset=dataset,
    )
    before = [p.detach().clone() for p in ours.model.parameters()]
    for trainer in (ours, theirs):
        torch.manual_seed(5)
        trainer.train()
    moved = False
    for p0, p_ours, p_theirs in zip(before, ours.model.parameters(), theirs.model.parameters(), strict=True):
        torch.testing.assert_close(p_ours, p_theirs, rtol=1e-5, atol=1e-6)
        moved = moved or not torch.equal(p0, p_ours)
    assert moved, "the step did not change the parameters: the comparison is vacuous"


#: TRL's documented recipe for the GSPO paper's setting (TRL 1.16 docs, paper index, "Group Sequence Policy
#: Optimization"), as a `trl.GRPOConfig`: what `GSPOConfig()` must train with no argument changed.
TRL_GSPO_RECIPE = dict(
    importance_sampling_level="sequence",
    loss_type="grpo",
    beta=0.0,
    epsilon=3e-4,
    epsilon_high=4e-4,
    gradient_accumulation_steps=1,
    steps_per_generation=4,
)


def test_gspo_preset_trains_as_trl_s_documented_gspo_recipe(tiny_model_path, tmp_path):
    """Two optimizer steps of `GSPOConfig()` and of TRL's GSPO recipe give the same parameters. The second step
    trains the rollout's second micro-batch with the weights the first step moved (and `num_iterations=2` keeps
    `pi_old` as TRL computes it), so the sequence ratio leaves 1 and its clip at 3e-4 / 4e-4 acts."""
    dataset = make_prompts()
    common = dict(max_steps=2, num_iterations=2, optim="sgd", learning_rate=1.0)
    ours = tr.GSPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.GSPOConfig(**cpu_args(output_dir=str(tmp_path / "ours"), **common)),
        train_dataset=dataset,
    )
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=GRPOConfig(**cpu_args(output_dir=str(tmp_path / "trl"), **common, **TRL_GSPO_RECIPE)),
        train_dataset=dataset,
    )
    assert {name: getattr(ours.args, name) for name in TRL_GSPO_RECIPE} == TRL_GSPO_RECIPE
    before = [p.detach().clone() for p in ours.model.parameters()]
    for trainer in (ours, theirs):
        torch.manual_seed(5)
        trainer.train()
    moved = False
    for p0, p_ours, p_theirs in zip(before, ours.model.parameters(), theirs.model.parameters(), strict=True):
        torch.testing.assert_close(p_ours, p_theirs, rtol=0, atol=1e-6)
        moved = moved or not torch.equal(p0, p_ours)
    assert moved, "the steps did not change the parameters: the comparison is vacuous"
    # the second step is off-policy and sequence ratios leave [1 - 3e-4, 1 + 4e-4]: the clip acts, on the same ones
    clipped = logged_metric(theirs, "clip_ratio/region_mean")
    assert clipped[0] == 0 and clipped[-1] > 0, clipped
    assert logged_metric(ours, "clip_ratio/region_mean") == pytest.approx(clipped)
