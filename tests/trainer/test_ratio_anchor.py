"""The ratio's anchor (``ratio_anchor``): what a ratio-based objective takes its importance ratio against.

On an asynchronous batch with one optimizer step per generation batch, ``pi_old`` is the learner itself, so the
clip on ``pi_theta / pi_old`` never acts. Anchored to the sampler (the DPPO paper's GRPO baseline, verl's bypass mode)
it acts against the policy that sampled; the decoupled anchor (AReaL) clips against the proximal policy and weighs by
``min(pi_prox / mu, C)``. These tests check each anchor's math against float64 references, the defaults per path, and
that the synchronous paths keep TRL's objective.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch, logged_metric, make_prompts

import trl_reasoning as tr
from trl_reasoning.algorithms.anchors import RATIO_ANCHORS
from trl_reasoning.algorithms.losses import POLICY_LOSSES, ratio_anchors
from trl_reasoning.presets import PRESETS


def _config(**overrides) -> tr.ReasoningConfig:
    return tr.ReasoningConfig(**cpu_args(**overrides))


def _trainer(model_path, tmp_path, config_cls=tr.ReasoningConfig, trainer_cls=tr.ReasoningTrainer, **overrides):
    args = config_cls(**cpu_args(output_dir=str(tmp_path), **overrides))
    return trainer_cls(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts(16))


# --------------------------------------------------------------------------------------------- the declared traits


def test_every_ratio_based_loss_declares_its_anchors_and_its_asynchronous_default():
    for name in POLICY_LOSSES.names():
        anchors = ratio_anchors(name)
        assert anchors and set(anchors) <= set(RATIO_ANCHORS), name
        default = POLICY_LOSSES.traits(name).async_anchor
        assert default in anchors, f"{name}: its asynchronous anchor {default!r} is not one of its anchors"
    assert ratio_anchors("dppo") == ("sampler",)  # DPPO's ratio and mask are the sampler's by definition
    # on an asynchronous run the clipped and gated objectives take AReaL's decoupled form (each token weighted by
    # min(pi_old / mu, C)), CISPO and DPPO their own ratio to the sampler; VESPO's weight already multiplies in
    # pi_old / mu
    assert {name: POLICY_LOSSES.traits(name).async_anchor for name in POLICY_LOSSES.names()} == {
        "clip": "decoupled",
        "cispo": "sampler",
        "sapo": "decoupled",
        "vespo": "pi_old",
        "dppo": "sampler",
        "sequence_clip": "decoupled",
        "gspo": "decoupled",
    }


# ------------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("settings", "want"),
    [
        (dict(), "pi_old"),  # synchronous: TRL's objective
        (dict(use_vllm=False, async_rollouts=True), "decoupled"),
        (dict(async_rollouts=True, policy_loss="cispo", epsilon_high=5.0), "sampler"),
        (dict(async_rollouts=True, vllm_importance_sampling_mode="token_mask"), "pi_old"),  # the user's correction
        (dict(async_rollouts=True, policy_loss="vespo"), "pi_old"),
        (dict(async_rollouts=False, policy_loss="dppo"), "sampler"),
        (dict(async_rollouts=True, ratio_anchor="pi_old"), "pi_old"),
        (dict(ratio_anchor="sampler"), "sampler"),
        (dict(async_rollouts=None), None),  # the trainer decides, once it knows whether the run is asynchronous
    ],
)
def test_the_anchor_resolves_at_construction_where_the_run_s_synchrony_is_known(settings, want):
    assert _config(**settings).ratio_anchor == want


def test_an_unknown_or_undefined_anchor_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"Unknown ratio_anchor 'bypass'.*pi_old, sampler, decoupled"):
        _config(ratio_anchor="bypass")
    with pytest.raises(ValueError, match=r"ratio_anchor='pi_old' is not defined for policy_loss='dppo'.*'sampler'"):
        _config(policy_loss="dppo", ratio_anchor="pi_old")
    with pytest.raises(ValueError, match=r"ratio_anchor='decoupled' is not defined for policy_loss='vespo'"):
        _config(policy_loss="vespo", ratio_anchor="decoupled")


def test_decoupled_runs_areal_s_per_token_truncation():
    config = _config(ratio_anchor="decoupled", vllm_importance_sampling_clip_max=5.0)
    assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_clip_max) == ("token_truncate", 5.0)
    # AReaL's default action drops a token past the cap: the masked mode, kept as written
    masked = _config(
        ratio_anchor="decoupled", vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=5.0
    )
    assert (masked.vllm_importance_sampling_mode, masked.vllm_importance_sampling_clip_max) == ("token_mask", 5.0)
    with pytest.raises(
        ValueError, match=r"ratio_anchor='decoupled'.*not by vllm_importance_sampling_mode='sequence_truncate'"
    ):
        _config(ratio_anchor="decoupled", vllm_importance_sampling_mode="sequence_truncate")
    with pytest.raises(ValueError, match=r"decoupled.*vllm_importance_sampling_correction=True"):
        _config(ratio_anchor="decoupled", vllm_importance_sampling_correction=False)


def test_the_help_names_verl_s_bypass_mode():
    help_text = tr.ReasoningConfig.__dataclass_fields__["ratio_anchor"].metadata["help"]
    assert "bypass" in help_text and "AReaL" in help_text


# ------------------------------------------------------------------------------------------------- in a trainer


@pytest.mark.parametrize("preset", PRESETS, ids=lambda preset: preset.name)
def test_every_preset_bounds_the_sampler_when_asynchronous_and_keeps_trl_s_objective_when_not(
    preset, tiny_model_path, tmp_path
):
    extra = {"epsilon_high": 5.0} if preset.config_class.__dataclass_fields__["policy_loss"].default == "cispo" else {}
    asynchronous = _trainer(
        tiny_model_path, tmp_path / "a", preset.config_class, preset.trainer_class, async_rollouts=True, **extra
    )
    synchronous = _trainer(
        tiny_model_path, tmp_path / "s", preset.config_class, preset.trainer_class, async_rollouts=False, **extra
    )
    loss = asynchronous.args.policy_loss
    assert asynchronous.args.ratio_anchor == POLICY_LOSSES.traits(loss).async_anchor
    assert synchronous.args.ratio_anchor == ("sampler" if loss == "dppo" else "pi_old")
    if asynchronous.args.ratio_anchor == "sampler":  # CISPO, DPPO: no second correction, TRL is not asked for one
        assert asynchronous.correction.source is None and not asynchronous._uses_trl_is_ratio()
    else:  # the clip family: AReaL's min(pi_prox / mu, C) per token, in the loss from its own forward where exact
        assert asynchronous.args.ratio_anchor == "decoupled"
        assert asynchronous.vllm_importance_sampling_mode == "token_truncate"
        args = asynchronous.args
        one_update = args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0
        assert asynchronous.correction.source == ("loss" if one_update else "trl")


def test_an_async_default_left_to_the_trainer_is_resolved_there(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path / "s", tr.ScaleRLConfig, tr.ScaleRLTrainer, max_steps=1)
    assert trainer.async_rollouts is not None and trainer.args.ratio_anchor == "sampler"
    trainer = _trainer(tiny_model_path, tmp_path / "d", tr.DAPOConfig, tr.DAPOTrainer, async_rollouts=None)
    assert trainer.async_rollouts is not None and trainer.args.ratio_anchor == "decoupled"
    # the decoupled anchor's truncation reaches TRL's copy of the mode and the correction's metrics
    assert trainer.vllm_importance_sampling_mode == trainer.args.vllm_importance_sampling_mode == "token_truncate"
    assert trainer.correction.stats["train"].mode == "token_truncate"


def test_an_asynchronous_run_without_a_trust_region_against_the_sampler_says_so_once(tiny_model_path, tmp_path):
    with pytest.warns(UserWarning, match=r"ratio_anchor='pi_old' with asynchronous rollouts.*never acts") as caught:
        trainer = _trainer(tiny_model_path, tmp_path, async_rollouts=True, ratio_anchor="pi_old", max_steps=2)
        trainer.train()
    assert sum("ratio_anchor='pi_old'" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for anchor in ("sampler", "decoupled"):
            _trainer(tiny_model_path, tmp_path / anchor, async_rollouts=True, ratio_anchor=anchor)


def test_the_sampler_anchor_on_a_synchronous_truncated_run_says_what_it_means(tiny_model_path, tmp_path):
    """Synchronously sampled by generate, mu is not recorded: the sampler anchor takes pi_old, which is not mu when
    sampling truncates (top_k=5). Said once, by name; silent without truncation and for DPPO (its definition)."""
    with pytest.warns(UserWarning, match=r"ratio_anchor='sampler' on a synchronous run.*top_k=5.*async_rollouts=True"):
        _trainer(tiny_model_path, tmp_path / "a", ratio_anchor="sampler", top_k=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(tiny_model_path, tmp_path / "b", ratio_anchor="sampler")
        _trainer(tiny_model_path, tmp_path / "c", policy_loss="dppo", top_k=5)


def _float64_clip_on_sampler(logps, mu, advantages, mask, low=0.2, high=0.28):
    """-min(r A, clip(r, 1 - low, 1 + high) A) with r = pi_theta / mu, in float64, token by token."""
    out = torch.zeros(logps.shape, dtype=torch.float64)
    for i in range(logps.size(0)):
        a = float(advantages[i])
        for t in range(logps.size(1)):
            if mask[i, t] and not math.isnan(float(mu[i, t])):
                r = math.exp(float(logps[i, t]) - float(mu[i, t]))
                out[i, t] = -min(r * a, min(max(r, 1 - low), 1 + high) * a)
    return out


def test_at_lag_2_the_clip_on_the_sampler_acts_and_equals_a_float64_reference(tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        async_rollouts=True,
        max_staleness=2,
        max_steps=4,
        epsilon_high=0.28,
        ratio_anchor="sampler",
    )
    trainer.train()
    # the clip acted during training: its ratio is to the policy of two steps earlier, not to the learner itself
    assert max(logged_metric(trainer, "clip_ratio/region_mean")[2:]) > 0
    inputs = generate_batch(trainer)  # sampled by the weights of two optimizer steps earlier
    mask = inputs["completion_mask"]
    with torch.no_grad():
        logps = trainer.behaviour_logps(inputs)
    mu = inputs["sampling_per_token_logps"]
    assert float(((logps - mu).abs() * mask).max()) > 1e-3, "the batch is not stale"
    logps = logps.clone().requires_grad_()
    per_token, _, stats = trainer._per_token_objective(inputs, logps, None, mask.float(), None)
    want = _float64_clip_on_sampler(logps.detach(), mu, inputs["advantages"], mask)
    torch.testing.assert_close((per_token * mask).double(), want, atol=1e-6, rtol=1e-6)
    assert float((stats["clip_ratio/low_mean"] | stats["clip_ratio/high_mean"])[mask.bool()].float().mean()) > 0
    # the gradient is the clip's: zero exactly where the clipped branch is taken
    (grad,) = torch.autograd.grad((per_token * mask).sum(), logps)
    reference = logps.detach().double().requires_grad_()
    ratio = torch.exp(reference - mu.double())
    adv = inputs["advantages"].double().unsqueeze(1)
    ref_loss = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv)
    (want_grad,) = torch.autograd.grad((ref_loss * mask).sum(), reference)
    torch.testing.assert_close(grad.double(), want_grad, atol=1e-6, rtol=1e-6)


def test_the_decoupled_anchor_clips_against_pi_prox_and_weighs_by_the_truncated_sampler_ratio(
    tiny_model_path, tmp_path
):
    """AReaL: -sg(min(pi_prox / mu, C)) * min(rho A, clip(rho) A), rho = pi_theta / pi_prox."""
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        async_rollouts=True,
        max_staleness=2,
        max_steps=3,
        ratio_anchor="decoupled",
        vllm_importance_sampling_clip_max=1.5,
    )
    trainer.train()
    inputs = generate_batch(trainer)
    mask = inputs["completion_mask"].float()
    with torch.no_grad():
        prox = trainer.behaviour_logps(inputs)
    inputs = trainer._with_loss_side_correction(inputs, prox, "train")
    inputs["old_per_token_logps"] = prox
    logps = (prox + 0.3 * torch.randn_like(prox)).requires_grad_()
    per_token, _, _ = trainer._per_token_objective(inputs, logps, None, mask, None)
    mu = inputs["sampling_per_token_logps"].double()
    weight = torch.clamp(torch.exp(prox.double() - mu), max=1.5)
    ratio = torch.exp(logps.detach().double() - prox.double())
    adv = inputs["advantages"].double().unsqueeze(1)
    want = -weight * torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
    torch.testing.assert_close((per_token * mask).double(), want * mask, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("anchor", ["sampler", "decoupled"])
def test_at_lag_0_every_anchor_trains_as_the_synchronous_run(anchor, tiny_model_path, tmp_path):
    runs = {}
    for name, settings in {
        "sync": dict(async_rollouts=False),
        "k0": dict(async_rollouts=True, max_staleness=0, ratio_anchor=anchor),
    }.items():
        torch.manual_seed(0)
        trainer = _trainer(tiny_model_path, tmp_path / name, max_steps=3, **settings)
        trainer.train()
        runs[name] = (logged_metric(trainer, "loss"), dict(trainer.model.named_parameters()))
    torch.testing.assert_close(torch.tensor(runs["k0"][0]), torch.tensor(runs["sync"][0]), atol=1e-6, rtol=1e-5)
    for name, param in runs["sync"][1].items():
        torch.testing.assert_close(runs["k0"][1][name], param, atol=1e-3, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------- IcePop


def test_token_icepop_runs_icepop_s_band_unless_a_bound_is_given():
    config = _config(vllm_importance_sampling_mode="token_icepop")
    assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (0.5, 5.0)
    config = _config(vllm_importance_sampling_mode="token_icepop", vllm_importance_sampling_clip_min=0.8)
    assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (0.8, 5.0)
    config = _config(vllm_importance_sampling_mode="token_icepop", vllm_importance_sampling_clip_max=2.0)
    assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (0.5, 2.0)
    # other modes keep TRL's defaults
    config = _config(vllm_importance_sampling_mode="token_mask")
    assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (None, 3.0)


def test_token_icepop_s_band_reaches_the_trainer_s_correction(tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        async_rollouts=True,
        ratio_anchor="pi_old",
        vllm_importance_sampling_mode="token_icepop",
    )
    stats = trainer.correction.stats["train"]
    assert (stats.clip_min, stats.clip_max) == (0.5, 5.0)
    assert (trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max) == (0.5, 5.0)


@pytest.mark.parametrize(
    ("config_cls", "trainer_cls"),
    [(tr.CISPOConfig, tr.CISPOTrainer), (tr.DPPOConfig, tr.DPPOTrainer), (tr.ScaleRLConfig, tr.ScaleRLTrainer)],
    ids=["cispo", "dppo", "scalerl"],
)
def test_a_correction_mode_the_sampler_s_ratio_makes_moot_is_named_once(
    config_cls, trainer_cls, tiny_model_path, tmp_path
):
    from trl import GRPOConfig

    from trl_reasoning.algorithms.importance_sampling import TRL_DEFAULT_CORRECTION_MODE

    assert GRPOConfig.__dataclass_fields__["vllm_importance_sampling_mode"].default == TRL_DEFAULT_CORRECTION_MODE
    with pytest.warns(UserWarning, match=r"vllm_importance_sampling_mode='token_mask' is not applied") as caught:
        _trainer(
            tiny_model_path,
            tmp_path / "set",
            config_cls,
            trainer_cls,
            async_rollouts=True,
            vllm_importance_sampling_mode="token_mask",
        )
    assert sum("is not applied" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(tiny_model_path, tmp_path / "default", config_cls, trainer_cls, async_rollouts=True)


def test_a_decoupled_default_yields_to_a_correction_the_user_chose():
    """Where an objective's asynchronous default is the decoupled anchor, it runs AReaL's per-token truncation; a user
    who turned the correction off or chose another mode keeps that choice on TRL's objective instead (asked for by
    name, the same is an error: see test_decoupled_runs_areal_s_per_token_truncation)."""
    from trl_reasoning.algorithms.anchors import resolve_anchor

    common = dict(policy_loss="clip", trl_default_mode="sequence_mask")
    supported = ("pi_old", "sampler", "decoupled")
    resolve = resolve_anchor
    assert resolve(None, supported, "decoupled", True, correction=True, mode="sequence_mask", **common) == (
        "decoupled",
        "token_truncate",
    )
    assert resolve(None, supported, "decoupled", True, correction=False, mode="sequence_mask", **common) == (
        "pi_old",
        "sequence_mask",
    )
    assert resolve(None, supported, "decoupled", True, correction=True, mode="token_mask", **common) == (
        "pi_old",
        "token_mask",
    )
    assert resolve(None, supported, "decoupled", False, correction=True, mode="sequence_mask", **common) == (
        "pi_old",
        "sequence_mask",
    )
    assert resolve(None, ("sampler",), "sampler", False, correction=True, mode="token_mask", **common) == (
        "sampler",
        "token_mask",
    )
