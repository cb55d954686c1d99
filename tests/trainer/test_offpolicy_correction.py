"""pi_old of the vLLM / asynchronous importance-sampling correction from the loss's own forward.

With one generation batch per optimizer step, TRL's no-grad forward for ``pi_old`` at scoring only repeats the loss
forward's (detached) log-probs. ``ReasoningTrainer`` skips it and builds the correction weight in the loss: the
losses, parameters after a step (plain SGD, learning rate 1: the update is the gradient) and the logged ``sampling/*``
metrics must equal ``GRPOTrainer``'s, with one forward over the batch fewer per step.

vLLM cannot run here: the engine is the stand-in of ``test_dppo_topk_vllm`` (TRL's ``VLLMGeneration`` interface,
sampling from the tiny model), on its own copy of the weights (so that only the trainer's forwards are counted) and
with its log-probs moved by a fixed noise (so that the ratios leave the truncation/mask band).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from conftest import cpu_args, digit_fraction, generate_batch, logged_metric, make_prompts
from test_dppo_topk_vllm import VLLMShapedGeneration
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

import trl_reasoning as tr

SAMPLING_METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


class NoisyEngine(VLLMShapedGeneration):
    """The stand-in engine on its own copy of the weights (synced as TRL syncs vLLM), whose reported log-probs are
    the sampling distribution's plus a fixed noise: a sampler that differs from the trainer, as vLLM's kernels do."""

    noise = 0.3

    def __init__(self, *, model, **kwargs):
        super().__init__(model=copy.deepcopy(model), **kwargs)
        self.trained = model
        self.noise_generator = torch.Generator().manual_seed(11)

    def sync_weights(self):
        self.model.load_state_dict(self.trained.state_dict())

    def generate(self, prompts, images, num_generations, profiler=None):
        prompts, completion_ids, logprobs, token_ids = super().generate(prompts, images, num_generations, profiler)
        for sequence in logprobs:
            for entries in sequence:
                entries[0] += self.noise * float(torch.randn((), generator=self.noise_generator))
        return prompts, completion_ids, logprobs, token_ids


@pytest.fixture
def noisy_vllm(monkeypatch):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", NoisyEngine)


def count_forwards(trainer) -> list[int]:
    """Calls of the trained model's forward, per optimizer step (the stand-in engine runs its own copy)."""
    calls, per_step = [0], []

    def hook(module, args, kwargs):
        calls[0] += 1

    trainer.model.register_forward_pre_hook(hook, with_kwargs=True)

    class Counter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            per_step.append(calls[0] - sum(per_step))

    trainer.add_callback(Counter())
    return per_step


def vllm_settings(tmp_path, name, **overrides) -> dict:
    settings = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=2,
        loss_type="dapo",
        epsilon_high=0.28,
        optim="sgd",
        learning_rate=1.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_clip_min=0.5,
        vllm_importance_sampling_clip_max=2.0,
    )
    settings.update(overrides)
    return cpu_args(output_dir=str(tmp_path / name), **settings)


def train(trainer) -> tuple[list[torch.Tensor], list[int]]:
    forwards = count_forwards(trainer)
    torch.manual_seed(5)
    trainer.train()
    return [p.detach().clone() for p in trainer.model.parameters()], forwards


def assert_same_run(ours, theirs, ours_params, their_params, metrics=SAMPLING_METRICS):
    for p_ours, p_theirs in zip(ours_params, their_params, strict=True):
        torch.testing.assert_close(p_ours, p_theirs, rtol=1e-6, atol=1e-6)
    for name in ("loss", *metrics):
        mine, trls = logged_metric(ours, name), logged_metric(theirs, name)
        assert len(mine) == len(trls) == ours.args.max_steps, name
        assert mine == pytest.approx(trls, rel=1e-6, abs=1e-6), name


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_equals_grpo_trainer_with_one_forward_fewer(mode, noisy_vllm, tiny_model_path, tmp_path):
    dataset = make_prompts()
    clip_min = 0.5 if mode.startswith("token") else 0.8  # the band the noisy engine's ratios leave
    band = dict(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min)
    ours = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.ReasoningConfig(**vllm_settings(tmp_path, "ours", **band)),
        train_dataset=dataset,
    )
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=GRPOConfig(**vllm_settings(tmp_path, "trl", **band)),
        train_dataset=dataset,
    )
    assert ours.correction.source == "loss"
    before = [p.detach().clone() for p in ours.model.parameters()]
    ours_params, ours_forwards = train(ours)
    their_params, their_forwards = train(theirs)
    assert any(not torch.equal(p0, p1) for p0, p1 in zip(before, ours_params, strict=True)), "nothing was trained"
    assert_same_run(ours, theirs, ours_params, their_params)
    # the correction did act: some weights left the band [clip_min, 2.0] and were masked or truncated
    lowest = logged_metric(ours, "sampling/importance_sampling_ratio/min")
    highest = logged_metric(ours, "sampling/importance_sampling_ratio/max")
    if mode.endswith("mask"):
        assert 0.0 in lowest
    else:
        assert any(v == pytest.approx(clip_min) for v in lowest) or 2.0 in highest
    # per step: TRL scores the 8-row generation batch in 2 chunks of 4 and trains 2 micro-batches of 4
    assert their_forwards == [4, 4]
    assert ours_forwards == [2, 2]
    ess = logged_metric(ours, "sampling/effective_sample_size")
    assert len(ess) == 2 and all(0 < value <= 1 for value in ess)


def test_the_switch_takes_trls_forward_back(noisy_vllm, tiny_model_path, tmp_path):
    dataset = make_prompts()
    trainers = {}
    for name, from_loss in (("loss", True), ("trl", False)):
        args = tr.DAPOConfig(
            **vllm_settings(
                tmp_path,
                name,
                loss_type=None,
                epsilon_high=None,
                vllm_importance_sampling_mode="token_mask",
                importance_sampling_pi_old_from_loss=from_loss,
                beta=0.04,
                use_bias_correction_kl=True,
            )
        )
        trainers[name] = tr.DAPOTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=dataset
        )
    assert trainers["trl"].correction.source == "trl"
    (loss_params, loss_forwards), (trl_params, trl_forwards) = (train(trainers[n]) for n in ("loss", "trl"))
    assert_same_run(trainers["loss"], trainers["trl"], loss_params, trl_params, (*SAMPLING_METRICS, "kl"))
    assert trl_forwards == [4, 4] and loss_forwards == [2, 2]
    # the ESS is logged on TRL's path too, with the same values
    assert logged_metric(trainers["loss"], "sampling/effective_sample_size") == pytest.approx(
        logged_metric(trainers["trl"], "sampling/effective_sample_size"), rel=1e-6
    )


def test_where_not_exact_trls_forward_stays(noisy_vllm, tiny_model_path, tmp_path):
    """Two optimizer steps per generation batch: the second trains with weights that changed since scoring."""
    args = tr.DAPOConfig(
        **vllm_settings(
            tmp_path, "x", loss_type=None, epsilon_high=None, gradient_accumulation_steps=1, steps_per_generation=2
        )
    )
    trainer = tr.DAPOTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    assert trainer.correction.source == "trl"
    args = tr.DAPOConfig(**vllm_settings(tmp_path, "y", loss_type=None, epsilon_high=None, num_iterations=2))
    trainer = tr.DAPOTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    assert trainer.correction.source == "trl"


def test_asynchronous_run_equals_trls_forward(tiny_model_path, tmp_path):
    """async_rollouts (inline, max_staleness=1, HF generate): the loss-side weight equals TRL's path (its forward at
    scoring), step for step, with the asynchronous metrics; the batch of step 2 is stale, so its ratios are not 1."""
    dataset = make_prompts()
    runs = {}
    for name, from_loss in (("loss", True), ("trl", False)):
        args = tr.DAPOConfig(
            **cpu_args(
                output_dir=str(tmp_path / name),
                per_device_train_batch_size=4,
                gradient_accumulation_steps=2,
                max_steps=3,
                optim="sgd",
                learning_rate=1.0,
                async_rollouts=True,
                max_staleness=1,
                vllm_importance_sampling_mode="token_truncate",
                vllm_importance_sampling_clip_min=0.9,
                vllm_importance_sampling_clip_max=1.1,
                importance_sampling_pi_old_from_loss=from_loss,
                ratio_anchor="pi_old",  # TRL's correction between pi_old and mu is what this compares
            )
        )
        trainer = tr.DAPOTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=dataset)
        runs[name] = (trainer, *train(trainer))
    (ours, ours_params, ours_forwards), (theirs, their_params, their_forwards) = runs["loss"], runs["trl"]
    assert ours.correction.source == "loss" and theirs.correction.source == "trl"
    metrics = (*SAMPLING_METRICS, "sampling/effective_sample_size", "async/is_weight_changed")
    assert_same_run(ours, theirs, ours_params, their_params, metrics)
    assert logged_metric(ours, "async/is_weight_changed")[-1] > 0  # the stale batch's weights were truncated
    # per step: one forward fewer over the 8-row batch (the sampler's log-probs are a forward of their own)
    assert [t - o for t, o in zip(their_forwards, ours_forwards, strict=True)] == [2, 2, 2]


@pytest.mark.parametrize("mode", ["sequence_geo_truncate", "sequence_geo_mask", "token_icepop"])
def test_new_modes_train_and_equal_their_scoring_path(mode, noisy_vllm, tiny_model_path, tmp_path):
    """Each new mode trains (finite loss, parameters move, ESS logged), and the loss-side weight equals the one built
    at scoring from a separate forward (importance_sampling_pi_old_from_loss=False)."""
    dataset = make_prompts()
    band = dict(
        vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=5.0 if mode == "token_icepop" else 1.3
    )
    runs = {}
    for name, from_loss in (("loss", True), ("scoring", False)):
        args = tr.DAPOConfig(
            **vllm_settings(
                tmp_path,
                name,
                loss_type=None,
                epsilon_high=None,
                vllm_importance_sampling_mode=mode,
                importance_sampling_pi_old_from_loss=from_loss,
                beta=0.04,
                **band,
            )
        )
        trainer = tr.DAPOTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=dataset)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        runs[name] = (trainer, *train(trainer))
        assert any(not torch.equal(p0, p1) for p0, p1 in zip(before, runs[name][1], strict=True))
        assert all(math.isfinite(v) for v in logged_metric(trainer, "loss"))
        assert len(logged_metric(trainer, "sampling/effective_sample_size")) == 2
    assert runs["loss"][0].correction.source == "loss" and runs["scoring"][0].correction.source == "scoring"
    assert_same_run(runs["loss"][0], runs["scoring"][0], runs["loss"][1], runs["scoring"][1])
    assert runs["loss"][2] == [2, 2] and runs["scoring"][2] == [4, 4]


def test_icepop_masked_tokens_get_no_gradient(tiny_model_path, tmp_path):
    """token_icepop: a token outside the band contributes no gradient at all, the KL penalty's included; TRL's
    token_mask zeroes only the policy term."""
    grads = {}
    for mode in ("token_mask", "token_icepop"):
        args = tr.ReasoningConfig(
            **cpu_args(output_dir=str(tmp_path / mode)),
            beta=0.1,
            vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_min=0.5,
            vllm_importance_sampling_clip_max=5.0,
        )
        trainer = tr.ReasoningTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
        batch = generate_batch(trainer)
        # every token outside the band (weight 0), and a reference policy away from the current one
        batch = {
            **batch,
            "importance_sampling_ratio": torch.zeros_like(batch["completion_mask"], dtype=torch.float32),
            "ref_per_token_logps": batch["ref_per_token_logps"] - 0.3,
        }
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, batch).backward()
        grads[mode] = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert any(g.abs().max() > 0 for g in grads["token_mask"])  # the KL gradient
    assert all(torch.count_nonzero(g) == 0 for g in grads["token_icepop"])


def test_unknown_mode_is_an_error_naming_the_field_and_the_modes(tmp_path):
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode 'geo'.*sequence_geo_mask.*token_icepop"):
        tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)), vllm_importance_sampling_mode="geo")
    with pytest.raises(ValueError, match="set vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max"):
        tr.ReasoningConfig(
            **cpu_args(output_dir=str(tmp_path)),
            vllm_importance_sampling_mode="sequence_geo_truncate",
            vllm_importance_sampling_clip_max=None,
        )


def test_verl_s_bypass_mode_on_the_synchronous_vllm_path(noisy_vllm, tiny_model_path, tmp_path):
    """ratio_anchor='sampler' on a synchronous vLLM run (verl's bypass mode): the clip is on pi_theta / mu with the
    engine's own log-probs, TRL builds no correction, and the clip acts where the engine's numerics differ; the
    default keeps TRL's objective (checked equal to GRPOTrainer above)."""
    assert tr.ReasoningConfig(**vllm_settings(tmp_path, "default")).ratio_anchor == "pi_old"
    args = tr.ReasoningConfig(**vllm_settings(tmp_path, "bypass", ratio_anchor="sampler", max_steps=1))
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    assert trainer.correction.source is None
    inputs = generate_batch(trainer)
    assert "importance_sampling_ratio" not in inputs
    mask = inputs["completion_mask"].float()
    mu = inputs["sampling_per_token_logps"]
    with torch.no_grad():
        logps = trainer.behaviour_logps(inputs)
    per_token, _, stats = trainer._per_token_objective(inputs, logps.clone().requires_grad_(), None, mask, None)
    ratio = torch.exp(logps.double() - mu.double())
    adv = inputs["advantages"].double().unsqueeze(1)
    want = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv)
    torch.testing.assert_close((per_token * mask).double(), want * mask, atol=1e-6, rtol=1e-6)
    acted = (stats["clip_ratio/low_mean"] | stats["clip_ratio/high_mean"]) & mask.bool()
    assert acted.any(), "the noisy engine's ratios never left the clip's range: the check is vacuous"
