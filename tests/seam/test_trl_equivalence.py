"""Where trl-reasoning's math coincides with TRL's, both trainers must give the same advantages, loss and gradients.

Both trainers load the same tiny model, generate the same completions (same seed), and are compared on:
the advantages of the generated batch, the loss, and every parameter's gradient, both on-policy (ratio 1) and with
perturbed behaviour log-probabilities so that clipping and capping are exercised.
"""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch, make_prompts
from trl import GRPOConfig, GRPOTrainer
from trl import RLOOConfig as TRLRLOOConfig
from trl import RLOOTrainer as TRLRLOOTrainer

import trl_reasoning as tr

TOLERANCE = dict(rtol=1e-5, atol=1e-7)


def _loss_and_grads(trainer, inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.model.parameters()]
    return loss.detach(), grads


def _perturbed_old_logps(trainer, inputs: dict, seed: int = 7) -> torch.Tensor:
    """Behaviour log-probs a little off the current policy, so ratios leave the clip range."""
    current = trainer._behaviour_logps(inputs)
    generator = torch.Generator().manual_seed(seed)
    return current + 0.4 * torch.randn(current.shape, generator=generator)


def _assert_same(
    ours, theirs, ours_inputs, their_inputs, their_old_key="old_per_token_logps", off_policy_tolerance=None
):
    """Same advantages; same loss and gradients on-policy and with perturbed behaviour log-probs.

    `their_old_key` names where TRL's trainer reads the behaviour log-probs: per token (`GRPOTrainer`), or summed over
    the completion (`RLOOTrainer`'s "old_logps").
    """
    torch.testing.assert_close(ours_inputs["advantages"], their_inputs["advantages"], **TOLERANCE)
    for off_policy in (False, True):
        tolerance = TOLERANCE
        if off_policy:
            old = _perturbed_old_logps(ours, ours_inputs)
            their_old = (
                old if their_old_key == "old_per_token_logps" else (old * their_inputs["completion_mask"]).sum(1)
            )
            ours_inputs = {**ours_inputs, "old_per_token_logps": old}
            their_inputs = {**their_inputs, their_old_key: their_old}
            tolerance = off_policy_tolerance or TOLERANCE
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
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_trl_grpo_trainer(case, tiny_model_path, tmp_path):
    trainer_cls, config_cls, ours_kwargs, trl_kwargs = CASES[case]
    dataset = make_prompts()
    ours = trainer_cls(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=config_cls(**cpu_args(output_dir=str(tmp_path / "ours"), **ours_kwargs)),
        train_dataset=dataset,
    )
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=GRPOConfig(**cpu_args(output_dir=str(tmp_path / "trl"), **trl_kwargs)),
        train_dataset=dataset,
    )
    if "beta" in ours_kwargs:  # move the policy off the reference so that the KL term is not zero
        _perturb_both(ours.model, theirs.model)
    ours_inputs, their_inputs = generate_batch(ours), generate_batch(theirs)
    torch.testing.assert_close(ours_inputs["completion_ids"], their_inputs["completion_ids"], rtol=0, atol=0)
    _assert_same(ours, theirs, ours_inputs, their_inputs)


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
