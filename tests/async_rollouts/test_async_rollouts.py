"""Asynchronous rollouts with a deterministic staleness bound (``async_rollouts``, ``max_staleness``).

What is checked: the batch of generation step ``g`` is sampled by the weights of step ``g - k`` (recomputing the
recorded sampler log-probs from those weights, and not from the current ones); each loss takes the ratio it is
defined with (clip: TRL's importance-sampling correction between pi_old and mu; CISPO and DPPO: their ratio against
mu, with no correction on top); ``k = 0`` trains exactly as a synchronous run; a resumed run equals the
uninterrupted one; every preset trains with it; and the refusals and warnings.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import (
    PRESETS,
    StopAt,
    cpu_args,
    digit_fraction,
    generate_batch,
    logged_metric,
    logps_under,
    lora_config,
    make_prompts,
    steps_per_rollout,
)
from transformers import AutoModelForCausalLM, TrainerCallback

import trl_reasoning as tr
from trl_reasoning.algorithms.losses import cispo_loss, clip_loss, dppo_loss
from trl_reasoning.async_rollouts.behaviour import (
    BEHAVIOUR_WEIGHTS_FILE,
    BehaviourWeights,
    host_snapshot,
    weights_swapped_in,
)
from trl_reasoning.async_rollouts.pipeline import importance_weight_share_changed

# ------------------------------------------------------------------------------------------------- the pure part


def test_staleness_grows_to_the_bound_and_the_oldest_snapshot_is_swapped_in():
    weights = BehaviourWeights(max_staleness=2)
    param = torch.nn.Parameter(torch.zeros(3))
    staleness = []
    for step in range(5):
        with torch.no_grad():
            param.fill_(float(step))
        staleness.append(weights.record({"w": param}))
        with weights.swapped_in({"w": param}) as lag:
            assert lag == staleness[-1]
            assert torch.equal(param.detach(), torch.full((3,), float(max(step - 2, 0))))
        assert torch.equal(param.detach(), torch.full((3,), float(step))), "the current weights were not restored"
    assert staleness == [0, 1, 2, 2, 2]


def test_a_snapshot_is_a_copy_that_later_steps_do_not_change():
    param = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    snapshot = host_snapshot({"w": param})
    with torch.no_grad():
        param.add_(1.0)
    assert torch.equal(snapshot["w"], torch.arange(6.0).reshape(2, 3))
    assert snapshot["w"].device.type == "cpu" and not snapshot["w"].requires_grad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_snapshot_is_pinned_and_swaps_in_and_back():  # pragma: no cover - GPU only
    # From a GPU the snapshot goes to page-locked memory with the copies queued (a pageable copy a tensor took ~1.5 s a
    # step for a 0.5B model on an H200): it must still hold exactly the weights, in and out of the model.
    params = {f"w{i}": torch.nn.Parameter(torch.randn(64, 33, device="cuda", dtype=torch.bfloat16)) for i in range(4)}
    before = {name: p.detach().clone() for name, p in params.items()}
    snapshot = host_snapshot(params)
    assert all(t.is_pinned() and torch.equal(t.cuda(), before[n]) for n, t in snapshot.items())
    with torch.no_grad():
        for p in params.values():
            p.mul_(-2.0)
    with weights_swapped_in(params, snapshot):
        assert all(torch.equal(p.detach(), before[n]) for n, p in params.items())
    assert all(torch.equal(p.detach(), -2.0 * before[n]) for n, p in params.items())


def test_staleness_zero_keeps_no_snapshot():
    weights = BehaviourWeights(max_staleness=0)
    param = torch.nn.Parameter(torch.ones(2))
    assert weights.record({"w": param}) == 0
    assert weights.state_dict()["snapshots"] == []
    with weights.swapped_in({"w": param}) as lag:
        assert lag == 0


def test_snapshots_survive_a_save_and_a_load(tmp_path):
    weights = BehaviourWeights(max_staleness=1)
    for value in (1.0, 2.0, 3.0):
        weights.record({"w": torch.full((2,), value)})
    weights.save(tmp_path)
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p], "the temporary file was left behind"
    restored = BehaviourWeights(max_staleness=1)
    assert restored.load(tmp_path)
    assert restored.generation_steps == 3 and restored.staleness == 1
    param = torch.nn.Parameter(torch.zeros(2))
    with restored.swapped_in({"w": param}):
        assert torch.equal(param.detach(), torch.full((2,), 2.0))
    assert not BehaviourWeights(1).load(tmp_path / "elsewhere")
    other_k = BehaviourWeights(3)
    with pytest.warns(UserWarning, match="saved with max_staleness=1, this run has max_staleness=3"):
        assert not other_k.load(tmp_path)
    assert other_k.generation_steps == 0 and other_k.staleness == 0, "another k's snapshots were taken in"
    (tmp_path / BEHAVIOUR_WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(RuntimeError, match=BEHAVIOUR_WEIGHTS_FILE):
        BehaviourWeights(1).load(tmp_path)


def test_share_of_changed_importance_weights_by_hand():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ratio = torch.tensor([[0.5, 3.0, 1.0], [3.0, 0.2, 9.0]])
    # truncate at 3: two of the five counted tokens sit at the cap (the 9.0 is padding)
    assert importance_weight_share_changed(ratio, mask, "token_truncate", None, 3.0) == pytest.approx(2 / 5)
    assert importance_weight_share_changed(ratio, mask, "token_truncate", 0.25, 3.0) == pytest.approx(3 / 5)
    masked = torch.tensor([[0.0, 1.2, 0.9], [1.0, 0.0, 0.0]])
    assert importance_weight_share_changed(masked, mask, "token_mask", None, 3.0) == pytest.approx(2 / 5)
    sequences = torch.tensor([[0.0], [1.5]])
    assert importance_weight_share_changed(sequences, mask, "sequence_mask", None, 3.0) == pytest.approx(1 / 2)


def test_config_checks_max_staleness():
    with pytest.raises(ValueError, match="max_staleness"):
        tr.ReasoningConfig(**cpu_args(), async_rollouts=True, max_staleness=-1)
    assert tr.ReasoningConfig(**cpu_args()).async_rollouts is False
    scalerl = tr.ScaleRLConfig(**cpu_args())
    assert (scalerl.async_rollouts, scalerl.max_staleness) == (None, 8)


# ------------------------------------------------------------------------------------------------- in a trainer


def _trainer(model_path, tmp_path, config_cls=tr.ReasoningConfig, trainer_cls=tr.ReasoningTrainer, **overrides):
    settings = dict(async_rollouts=True, max_staleness=2, max_steps=5)
    settings.update(overrides)
    args = config_cls(**cpu_args(output_dir=str(tmp_path), **settings))
    return trainer_cls(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=tr_prompts())


def tr_prompts():
    return make_prompts(16)


class _Recording:
    """Records, around the trainer's ``_generate``, the weights at each generation step and what was sampled."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.calls = []
        generate = trainer._generate

        def recorded(prompts):
            weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
            output = generate(prompts)
            self.calls.append((trainer.state.global_step, weights, output[0], output[1], output[4]))
            return output

        trainer._generate = recorded


@pytest.mark.parametrize("policy_loss", ["clip", "cispo", "dppo"])
def test_each_batch_is_sampled_by_the_weights_of_k_steps_earlier(policy_loss, tiny_model_path, tmp_path):
    k = 2
    trainer = _trainer(tiny_model_path, tmp_path, policy_loss=policy_loss, max_staleness=k)
    recording = _Recording(trainer)
    trainer.train()
    assert logged_metric(trainer, "async/staleness") == [0, 1, 2, 2, 2]
    weights_at = {step: weights for step, weights, *_ in recording.calls}
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    differs_from_current = 0
    for step, current, prompt_ids, completion_ids, logprobs in recording.calls:
        behaviour = weights_at[max(step - k, 0)]
        expected = logps_under(reference, behaviour, prompt_ids, completion_ids, trainer.temperature)
        for recorded, want in zip(logprobs, expected, strict=True):
            torch.testing.assert_close(torch.tensor(recorded, dtype=torch.float64), want, atol=1e-4, rtol=1e-4)
        if step >= 1:
            now = logps_under(reference, current, prompt_ids, completion_ids, trainer.temperature)
            differs_from_current += max(float((torch.tensor(r) - n).abs().max()) for r, n in zip(logprobs, now))
    assert differs_from_current > 1e-2, "the recorded log-probs are those of the current weights: nothing lagged"
    losses = logged_metric(trainer, "loss")
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)


def _stale_batch(trainer):
    """A training batch sampled one optimizer step late: one step trained, then a generation step."""
    trainer.train()
    return generate_batch(trainer)


@pytest.mark.parametrize(
    ("policy_loss", "anchor"),
    [("clip", "pi_old"), ("clip", None), ("clip", "sampler"), ("cispo", None), ("dppo", None)],
)
def test_each_loss_takes_the_ratio_it_is_defined_with(policy_loss, anchor, tiny_model_path, tmp_path):
    """The clip on pi_old (TRL's objective, asked for by name) with TRL's correction on top, as the decoupled anchor
    (the clip's asynchronous default) is at one step a batch with AReaL's per-token truncation; the clip on the
    sampler and CISPO's and DPPO's own ratios to the sampler with no correction on top."""
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        policy_loss=policy_loss,
        ratio_anchor=anchor,
        max_staleness=1,
        max_steps=1,
        epsilon_high=5.0 if policy_loss == "cispo" else 0.28,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
    )
    on_pi_old = trainer.args.ratio_anchor in ("pi_old", "decoupled")
    inputs = _stale_batch(trainer)
    mask = inputs["completion_mask"].float()
    mu = inputs["sampling_per_token_logps"]
    # In one update per batch pi_old is pi_theta, which the loss takes from its own forward: TRL is asked neither for
    # its extra forward nor, for a ratio against the sampler, for its correction
    assert "old_per_token_logps" not in inputs and "importance_sampling_ratio" not in inputs
    with torch.no_grad():
        old = trainer.behaviour_logps(inputs)
    if on_pi_old:
        # TRL's token_truncate correction between pi_old and mu, exactly, built in the loss from its forward
        inputs = trainer._with_loss_side_correction(inputs, old, "train")
        inputs["old_per_token_logps"] = old  # pi_theta is moved off pi_old below: pass pi_old itself
        want_ratio = torch.clamp(torch.exp((old - mu) * mask), max=3.0)
        torch.testing.assert_close(inputs["importance_sampling_ratio"] * mask, want_ratio * mask)
    assert float(((mu - old).abs() * mask).max()) > 1e-4, "the batch is not stale"

    logps = (old + 0.05 * torch.randn_like(old)).requires_grad_()
    advantages = inputs["advantages"].unsqueeze(1)
    per_token, _, stats = trainer._per_token_objective(inputs, logps, None, mask, None)
    if not on_pi_old:
        torch.testing.assert_close(stats["async/sampler_ratio/mean"], torch.exp(logps.detach() - mu))
        # pi_old from TRL's forward would not have changed the loss: it enters only where mu is missing (NaN)
        with_old, _, _ = trainer._per_token_objective({**inputs, "old_per_token_logps": old}, logps, None, mask, None)
        torch.testing.assert_close(with_old * mask, per_token * mask)
    if on_pi_old:
        want = clip_loss(logps, old, advantages, mask, 0.2, 0.28) * inputs["importance_sampling_ratio"]
    elif policy_loss == "clip":
        want = clip_loss(logps, mu, advantages, mask, 0.2, 0.28)  # against mu, no correction on top
    elif policy_loss == "cispo":
        want = cispo_loss(logps, mu, advantages, mask, epsilon_high=5.0)  # against mu, no correction on top
    else:
        want = dppo_loss(logps, old, advantages, mask, rollout_logps=mu)
    torch.testing.assert_close(per_token * mask, want * mask)
    (grad,) = torch.autograd.grad((per_token * mask).sum(), logps)
    (want_grad,) = torch.autograd.grad((want * mask).sum(), logps)
    torch.testing.assert_close(grad, want_grad)


@pytest.mark.parametrize("policy_loss", ["clip", "cispo", "dppo"])
def test_staleness_zero_trains_as_the_synchronous_run(policy_loss, tiny_model_path, tmp_path):
    runs = {}
    for name, settings in {
        "sync": dict(async_rollouts=False),
        "k0": dict(async_rollouts=True, max_staleness=0),
    }.items():
        torch.manual_seed(0)
        trainer = _trainer(tiny_model_path, tmp_path / name, policy_loss=policy_loss, max_steps=3, **settings)
        trainer.train()
        runs[name] = (logged_metric(trainer, "loss"), dict(trainer.model.named_parameters()))
    # mu is read from generate's scores (KV-cache numerics), pi from the training forward: equal to ~1e-7; the clip's
    # asynchronous anchor (decoupled) weighs by TRL's correction, CISPO's and DPPO's (the sampler) log their own ratio
    if policy_loss == "clip":
        ratio = logged_metric(trainer, "sampling/importance_sampling_ratio/mean")
        torch.testing.assert_close(torch.tensor(ratio), torch.ones(3), atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(torch.tensor(logged_metric(trainer, "async/sampler_ratio/mean")), torch.ones(3))
    torch.testing.assert_close(torch.tensor(runs["k0"][0]), torch.tensor(runs["sync"][0]), atol=1e-6, rtol=1e-5)
    # Adam divides by the gradient's running scale: on a near-zero gradient a ~1e-7 difference in mu can move a weight
    # by ~1e-4; the bound is a tenth of one Adam step (lr 1e-2), losses agree to 1e-6
    for name, param in runs["sync"][1].items():
        torch.testing.assert_close(runs["k0"][1][name], param, atol=1e-3, rtol=1e-5)


def test_a_resumed_run_equals_the_uninterrupted_one(tiny_model_path, tmp_path):
    settings = dict(max_steps=6, max_staleness=2, save_strategy="steps", save_steps=3)
    full = _trainer(tiny_model_path, tmp_path / "full", **settings)
    full.train()

    first = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    first.add_callback(StopAt(3))
    first.train()
    checkpoint = tmp_path / "cut" / "checkpoint-3"
    assert (checkpoint / BEHAVIOUR_WEIGHTS_FILE).is_file()
    resumed = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    def after_step_3(trainer, name):
        return [e[name] for e in trainer.state.log_history if name in e and e["step"] > 3]

    assert after_step_3(resumed, "async/staleness") == after_step_3(full, "async/staleness") == [2, 2, 2]
    torch.testing.assert_close(
        torch.tensor(after_step_3(resumed, "loss")), torch.tensor(after_step_3(full, "loss")), atol=1e-5, rtol=1e-4
    )
    _assert_same_parameters(resumed, full)

    # Another max_staleness: the saved snapshots are not this lag's; the pipeline restarts and training goes on.
    other_k = _trainer(tiny_model_path, tmp_path / "cut", **{**settings, "max_staleness": 1})
    with pytest.warns(UserWarning, match="saved with max_staleness=2, this run has max_staleness=1"):
        other_k.train(resume_from_checkpoint=str(checkpoint))
    assert other_k.state.global_step == 6
    assert after_step_3(other_k, "async/staleness") == [0, 1, 1]
    assert all(math.isfinite(x) for x in after_step_3(other_k, "loss"))

    # Without the behaviour weights (a checkpoint copied without that file) the resume says what it loses.
    (checkpoint / BEHAVIOUR_WEIGHTS_FILE).unlink()
    again = _trainer(tiny_model_path, tmp_path / "cut", **{**settings, "max_steps": 4})
    with pytest.warns(UserWarning, match="no behaviour weights"):
        again.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_trains_asynchronously(name, tiny_model_path, tmp_path):
    trainer_cls, config_cls, reward = PRESETS[name]
    # three generation steps: a preset that trains each rollout batch as several optimizer steps (GSPO: 4) samples
    # once every that many steps
    steps = 3 * steps_per_rollout(config_cls)
    args = config_cls(**cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_staleness=1, max_steps=steps))
    trainer = trainer_cls(model=tiny_model_path, reward_funcs=reward, args=args, train_dataset=tr_prompts())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert logged_metric(trainer, "async/staleness") == [0, 1, 1]
    assert all(math.isfinite(x) for x in logged_metric(trainer, "loss"))
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())


def test_scalerl_is_asynchronous_with_k_8_by_default_and_synchronous_when_turned_off(tiny_model_path, tmp_path):
    trainer_cls, config_cls, reward = PRESETS["ScaleRL"]
    default = trainer_cls(
        model=tiny_model_path,
        reward_funcs=reward,
        args=config_cls(**cpu_args(output_dir=str(tmp_path / "a"))),
        train_dataset=tr_prompts(),
    )
    assert default.async_rollouts is not None and default.async_rollouts.behaviour.max_staleness == 8
    off = trainer_cls(
        model=tiny_model_path,
        reward_funcs=reward,
        args=config_cls(**cpu_args(output_dir=str(tmp_path / "b"), async_rollouts=False)),
        train_dataset=tr_prompts(),
    )
    assert off.async_rollouts is None
    off.train()
    assert logged_metric(off, "async/staleness") == []


def test_lora_snapshots_only_the_adapters(tiny_model_path, tmp_path):
    args = tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_staleness=2, max_steps=3))
    trainer = tr.DAPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=tr_prompts(),
        peft_config=lora_config(),
    )
    trainer.train()
    snapshot = trainer.async_rollouts.behaviour.state_dict()["snapshots"][0]
    assert snapshot and all("lora" in name for name in snapshot)
    assert logged_metric(trainer, "async/staleness") == [0, 1, 2]


def test_dynamic_sampling_rounds_share_their_step_s_staleness(tiny_model_path, tmp_path):
    """Extra rounds come from the same behaviour weights: a dropped group does not make the next round staler."""
    args = tr.DAPOConfig(
        **cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_staleness=1, max_steps=3),
        dynamic_sampling=True,
        max_num_gen_batches=3,
    )

    def mostly_zero(completions, **kwargs):
        return [float(i % 8 == 0) for i in range(len(completions))]  # one informative group in two

    trainer = tr.DAPOTrainer(model=tiny_model_path, reward_funcs=mostly_zero, args=args, train_dataset=tr_prompts())
    staleness_per_call = []
    generate = trainer._generate

    def recorded(prompts):
        output = generate(prompts)
        staleness_per_call.append((trainer.state.global_step, trainer._metrics["train"]["async/staleness"][-1]))
        return output

    trainer._generate = recorded
    trainer.train()
    assert len(staleness_per_call) > 3, "no extra round ran"
    for step, staleness in staleness_per_call:
        assert staleness == min(step, 1)


# ------------------------------------------------------------------------------------------ the generator process


def _assert_same_parameters(trainer, reference) -> None:
    """``trainer``'s model holds ``reference``'s parameters, to the tolerance of a resumed run."""
    expected = dict(reference.model.named_parameters())
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, expected[name], atol=1e-5, rtol=1e-4)


def _sampled_batches(trainer) -> list:
    """Wraps the trainer's ``_generate``: the completion ids of every training generation call, in order."""
    calls = []
    generate = trainer._generate

    def recorded(prompts):
        output = generate(prompts)
        if trainer.model.training:
            calls.append((trainer.state.global_step, output[1], output[4]))
        return output

    trainer._generate = recorded
    return calls


@pytest.mark.parametrize(
    "settings",
    [
        dict(policy_loss="clip"),
        dict(policy_loss="cispo", epsilon_high=5.0),
        dict(policy_loss="dppo"),
        dict(policy_loss="clip", dynamic_sampling=True, max_num_gen_batches=3),
        # TRL's sampling settings reach the worker through the trainer's generation config (a repetition penalty or
        # an n-gram ban would be refused: the trainer does not repeat them when it scores the policy)
        dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, generation_kwargs={"repetition_penalty": 1.0}),
        # REINFORCE++'s per-token advantages, with the KL to the reference in their return
        dict(advantage_estimator="reinforce_pp_baseline", beta=0.05),
    ],
    ids=["clip", "cispo", "dppo", "dynamic-sampling", "trl-sampling-settings", "reinforce_pp"],
)
def test_the_generator_process_samples_the_batches_of_the_inline_one(settings, tiny_model_path, tmp_path):
    """The worker samples ahead of the trainer with the same behaviour weights and seeds as the in-process
    generator: the same completions, the same sampler log-probs (to float tolerance: another forward), the same
    training (losses, parameters). The worker runs one torch thread; so does the trainer here, as under the README's
    pytest-xdist command, so that the two forwards also match when the suite runs in one process (two threads there
    move the log-probs by ~7e-4 on this tiny random model)."""
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for generator in ("inline", "process"):
            runs[generator] = _generator_run(generator, settings, tiny_model_path, tmp_path)
    finally:
        torch.set_num_threads(threads)
    (inline_calls, inline_losses, inline_params), (calls, losses, params) = runs["inline"], runs["process"]
    assert [(step, ids) for step, ids, _ in calls] == [(step, ids) for step, ids, _ in inline_calls]
    for (_, _, logps), (_, _, inline_logps) in zip(calls, inline_calls, strict=True):
        for row, inline_row in zip(logps, inline_logps, strict=True):
            torch.testing.assert_close(torch.tensor(row), torch.tensor(inline_row), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(inline_losses), atol=1e-3, rtol=1e-3)
    for name, param in inline_params.items():
        torch.testing.assert_close(params[name], param, atol=2e-3, rtol=1e-3)


def _generator_run(generator, settings, tiny_model_path, tmp_path):
    """One run of the inline/process comparison: its sampled batches, logged losses and final parameters."""
    trainer = _trainer(tiny_model_path, tmp_path / generator, max_staleness=2, async_generator=generator, **settings)
    calls = _sampled_batches(trainer)
    trainer.train()
    if generator == "process":
        assert trainer.async_rollouts.pipeline._generator is None, "the worker outlived train()"
    return calls, logged_metric(trainer, "loss"), dict(trainer.model.named_parameters())


def test_the_generator_process_resumes_as_the_uninterrupted_run(tiny_model_path, tmp_path):
    settings = dict(max_steps=5, max_staleness=2, async_generator="process", save_strategy="steps", save_steps=3)
    full = _trainer(tiny_model_path, tmp_path / "full", **settings)
    full_calls = _sampled_batches(full)
    full.train()
    first = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    first.add_callback(StopAt(3))
    first.train()
    resumed = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    resumed_calls = _sampled_batches(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-3"))
    assert [ids for _, ids, _ in resumed_calls] == [ids for _, ids, _ in full_calls[3:]]
    _assert_same_parameters(resumed, full)


def test_the_generator_process_ships_only_the_adapters_of_a_lora_run(tiny_model_path, tmp_path):
    args = tr.DAPOConfig(
        **cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_staleness=1, max_steps=3),
        async_generator="process",
    )
    trainer = tr.DAPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=tr_prompts(),
        peft_config=lora_config(),
    )
    submitted = []
    submit = trainer.async_rollouts.pipeline.submit

    def recorded(step, prompts):
        if step not in trainer.async_rollouts.pipeline._jobs:
            submitted.append(sorted(trainer.async_rollouts.behaviour.weights_for(step)))
        submit(step, prompts)

    trainer.async_rollouts.pipeline.submit = recorded
    trainer.train()
    assert submitted and all(names and all("lora" in n for n in names) for names in submitted)
    assert logged_metric(trainer, "async/staleness") == [0, 1, 1]
    assert all(math.isfinite(x) for x in logged_metric(trainer, "loss"))


def test_the_worker_samples_with_the_trainers_generation_config_and_a_kv_cache(tiny_model_path, tmp_path):
    """The Trainer sets ``config.use_cache=False`` (a training setting); a model rebuilt from that config alone would
    sample without a KV cache (5x slower on SmolLM2-135M). The worker's copy keeps the model's generation config."""
    from trl_reasoning.async_rollouts.process_generator import _rebuild, model_recipe

    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=1, async_generator="process")
    model = trainer.model
    assert model.config.use_cache is False, "the Trainer no longer turns the cache off: this test is vacuous"
    model.generation_config.no_repeat_ngram_size = 3  # any setting of the model's own generation config
    rebuilt = _rebuild(model_recipe(model))
    assert rebuilt.generation_config.to_dict() == model.generation_config.to_dict()
    output = rebuilt.generate(
        input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False, return_dict_in_generate=True
    )
    assert output.past_key_values is not None, "the worker generates without a KV cache"


def _stop_worker_at(trainer, step: int, how: str) -> list:
    """Kill or stop the worker at the end of optimizer ``step``; returns the list its process and the time it was
    signalled are put in."""
    signalled: list = []

    class Stop(StopAt):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                process = trainer.async_rollouts.pipeline.generator._process
                os.kill(process.pid, {"kill": 9, "stop": 19}[how])  # SIGKILL, SIGSTOP
                signalled.extend([process, time.monotonic()])

    trainer.add_callback(Stop(step))
    return signalled


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_worker_that_dies_or_hangs_is_a_clear_error(how, tiny_model_path, tmp_path):
    """A stopped worker (SIGSTOP) neither answers nor dies: the wait says so within seconds, not at async_timeout
    (600 s by default) with "raise async_timeout", and train() closing the generator kills it rather than waiting
    10 s for it to finish its job."""
    from trl_reasoning.async_rollouts.protocols import GeneratorError

    trainer = _trainer(
        tiny_model_path, tmp_path, max_steps=6, max_staleness=1, async_generator="process", async_timeout=60.0
    )
    signalled = _stop_worker_at(trainer, 1, how)
    match = "died" if how == "kill" else r"The generator worker \(pid \d+\) is stopped \(SIGSTOP.*kill -STOP \d+"
    try:
        with pytest.raises(GeneratorError, match=match):
            trainer.train()
        process, signalled_at = signalled
        assert time.monotonic() - signalled_at < 10, "the worker was waited for (train() closes it before raising)"
        assert not process.is_alive(), "the stopped worker was left behind"
    finally:
        trainer.async_rollouts.pipeline.close()


def test_the_generator_process_refuses_what_it_cannot_sample(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="async_generator='process'.*max_staleness >= 1"):
        tr.ReasoningConfig(**cpu_args(), async_rollouts=True, max_staleness=0, async_generator="process")
    with pytest.raises(ValueError, match="async_generator"):
        tr.ReasoningConfig(**cpu_args(), async_generator="thread")
    with pytest.raises(
        ValueError, match="async_generator='process' does not support more or less than one generation"
    ):
        _trainer(tiny_model_path, tmp_path, async_generator="process", steps_per_generation=2)


def test_with_async_rollouts_none_a_run_the_generator_refuses_trains_synchronously_saying_why(
    tiny_model_path, tmp_path
):
    """``None`` is "on where the run supports it": what the chosen generator refuses is a reason like any other."""
    with pytest.warns(UserWarning, match=r"trains synchronously, because async_generator='process' does not support "
                      r"more or less than one generation") as warned:  # fmt: skip
        trainer = _trainer(
            tiny_model_path, tmp_path, async_rollouts=None, async_generator="process", steps_per_generation=2
        )
    assert trainer.async_rollouts is None
    (message,) = [str(w.message) for w in warned if "trains synchronously" in str(w.message)]
    # the user passed None: ReasoningConfig's own default is False, and the sentences end once
    assert message.startswith("async_rollouts=None: ") and ".." not in message


def test_a_script_without_a_main_guard_trains_once(tiny_model_path, tmp_path):
    """The worker is a spawned process, which re-runs an unguarded main script unless told not to."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from conftest import cpu_args, digit_fraction, make_prompts\n"
        "import trl_reasoning as tr\n"
        "print('TRAINING STARTS')\n"
        f"args = tr.ReasoningConfig(**cpu_args(output_dir={str(tmp_path / 'out')!r}, async_rollouts=True,"
        " max_staleness=1, async_generator='process', max_steps=2))\n"
        f"tr.ReasoningTrainer(model={tiny_model_path!r}, reward_funcs=digit_fraction, args=args,"
        " train_dataset=make_prompts()).train()\n"
        "print('TRAINING ENDS')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("TRAINING STARTS") == 1 and result.stdout.count("TRAINING ENDS") == 1


def test_evaluation_during_training_samples_with_the_current_weights(tiny_model_path, tmp_path):
    """Evaluation is not a pipeline batch: it samples with the weights being trained, records nothing and leaves the
    pipeline where it was (the training staleness goes on 0, 1, 2, 2)."""
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_staleness=2, max_steps=4),
        eval_strategy="steps",
        eval_steps=2,
    )
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=tr_prompts(),
        eval_dataset=tr_prompts().select(range(8)),
    )
    evaluated = []
    generate = trainer._generate

    def recorded(prompts):
        output = generate(prompts)
        if not trainer.model.training:
            evaluated.append(output[4])
        return output

    trainer._generate = recorded
    trainer.train()
    assert evaluated, "no evaluation ran"
    assert trainer.async_rollouts.behaviour.generation_steps == 4
    assert logged_metric(trainer, "async/staleness") == [0, 1, 2, 2]
    assert [e for e in trainer.state.log_history if "eval_reward" in e], "evaluation logged nothing"


def test_a_train_that_raised_leaves_no_generator_and_the_next_one_resumes_as_the_uninterrupted_run(
    tiny_model_path, tmp_path
):
    """A notebook user's second ``train()`` after an exception (Ctrl-C, a timeout): the worker is stopped when the
    first one raises, and the resumed run reads ahead from its own position (not the failed run's)."""
    settings = dict(max_steps=5, max_staleness=2, async_generator="process", save_strategy="steps", save_steps=3)
    full = _trainer(tiny_model_path, tmp_path / "full", **settings)
    full_calls = _sampled_batches(full)
    full.train()

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise KeyboardInterrupt

    trainer = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    trainer.add_callback(Interrupt())
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.async_rollouts.pipeline._generator is None, "the worker outlived the train() that raised"
    trainer.pop_callback(Interrupt)
    calls = _sampled_batches(trainer)
    trainer.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-3"))
    assert [ids for _, ids, _ in calls] == [ids for _, ids, _ in full_calls[3:]]
    _assert_same_parameters(trainer, full)


def test_the_first_batch_is_sent_before_the_batches_read_ahead(tiny_model_path, tmp_path):
    """The generator works first-in first-out: the step being trained goes first, then the next ``k``."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=2, max_steps=3, async_generator="process")
    order = []
    submit = trainer.async_rollouts.pipeline.submit

    def recorded(step, prompts):
        if step not in trainer.async_rollouts.pipeline._jobs:
            order.append(step)
        submit(step, prompts)

    trainer.async_rollouts.pipeline.submit = recorded
    trainer.train()
    assert order == [0, 1, 2]


def test_packed_weights_travel_as_one_shared_block_per_dtype():
    from trl_reasoning.async_rollouts.process_generator import packed, unpacked

    weights = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5),
        "c": torch.randn(2, 2).to(torch.bfloat16),
        "d": torch.randn(1, 2, 3),
    }
    shipped = packed(weights)
    assert len(shipped["flat"]) == 2 and all(flat.is_shared() for flat in shipped["flat"])
    back = unpacked(shipped)
    assert set(back) == set(weights)
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)


@pytest.mark.parametrize(
    "settings",
    [
        dict(async_generator="inline"),  # samples ahead in the training process
        dict(async_generator="inline", dynamic_sampling=True, max_num_gen_batches=2),  # keeps weight snapshots
        dict(async_generator="process"),
    ],
    ids=["inline", "inline-snapshots", "process"],
)
def test_a_second_train_is_a_fresh_run_of_the_same_trainer(settings, tiny_model_path, tmp_path):
    """Notebooks call ``train()`` again: the second run starts at generation step 0 with the weights the first left,
    its lag grows to ``k`` again, it samples ahead again and warns of nothing (it once restarted every step)."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=2, max_steps=4, **settings)
    trainer.train()
    first = logged_metric(trainer, "async/staleness")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.train()
    assert first == logged_metric(trainer, "async/staleness") == [0, 1, 2, 2]
    assert trainer.async_rollouts.behaviour.generation_steps == 4
    losses = logged_metric(trainer, "loss")
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


def test_a_resume_on_another_number_of_processes_names_that_cause(tiny_model_path, tmp_path):
    """A checkpoint's sampled batches are kept per process: resumed on another number of processes they are not
    used, and the restart warning says that this is why (it listed every possible cause: another generator, number
    of processes or dynamic-sampling setting). The checkpoint is made a two-process one by its recorded
    ``world_size``, which is what the resume reads."""
    settings = dict(max_steps=6, max_staleness=2, save_strategy="steps", save_steps=3)
    first = _trainer(tiny_model_path, tmp_path, **settings)
    first.add_callback(StopAt(3))
    first.train()
    path = tmp_path / "checkpoint-3" / BEHAVIOUR_WEIGHTS_FILE
    state = torch.load(path, weights_only=True)
    assert state["world_size"] == 1 and sorted(state["batches"]) == [3, 4], "the checkpoint is not the one meant"
    torch.save({**state, "world_size": 2}, path)

    resumed = _trainer(tiny_model_path, tmp_path, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    restarts = [str(w.message) for w in caught if "The pipeline restarts" in str(w.message)]
    assert len(restarts) == 1, [str(w.message) for w in caught]
    assert "The checkpoint this run resumed from was written by 2 processes and this run has 1 process" in restarts[0]
    assert "Resume with 2 processes" in restarts[0] and "dynamic-sampling" not in restarts[0]
    assert [e["async/staleness"] for e in resumed.state.log_history if "async/staleness" in e and e["step"] > 3] == [
        0,
        1,
        2,
    ]
