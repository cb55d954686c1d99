"""The reference reset (``trl_reasoning.trainer.reference_reset``, ProRL's; any trainer of the package takes it from
its config): at the end of a rollout batch the KL reference becomes a copy of the policy (with LoRA: a frozen copy of
the adapter) and the optimizer's state is cleared; the config refuses what it cannot do, by field name; a checkpoint
taken after a reset resumes as the uninterrupted run, reference included; two processes reset at the same steps; an
asynchronous run scores the reference with the trainer's own weights."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import StopAt, cpu_args, digit_fraction, logged_metric, lora_config, make_prompts, run_torchrun
from safetensors.torch import load_file
from transformers import TrainerCallback

import trl_reasoning as tr
from trl_reasoning.trainer.reference_reset import (
    REFERENCE_ADAPTER,
    REFERENCE_STATE_FILE,
    REFERENCE_WEIGHTS_FILE,
    ReferenceReset,
    ReferenceResetError,
    innermost_optimizer,
    reference_reset_for,
    reset_optimizer_state,
)

WORKER = Path(__file__).with_name("reference_reset_worker.py")
#: A run with a reference to reset: the clipped objective (ProRL's, as DAPO's) with a KL coefficient large enough
#: that the reference shapes the update; rollout batches of 2 prompts x 4 completions trained as 2 optimizer steps.
RESET_RUN = dict(beta=0.1, epsilon_high=0.4, steps_per_generation=2, per_device_train_batch_size=4, max_steps=3)


def _trainer(model_path, output_dir, peft=False, **overrides) -> tr.ReasoningTrainer:
    """``peft``: ``True`` for ``lora_config()``, or a PEFT config of its own."""
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(output_dir), **{**RESET_RUN, **overrides}))
    return tr.ReasoningTrainer(
        model=model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(),
        peft_config=(lora_config() if peft is True else peft) or None,
    )


def reference_and_policy(trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The reference's parameters and the policy's matching ones, by the policy's names: the reference model's, or
    (LoRA) the ``"ref"`` adapter's next to the trained adapter's (empty before the first reset)."""
    policy = dict(trainer.model.named_parameters())
    if trainer.ref_model is not None:
        return {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}, {
            n: p.detach().clone() for n, p in policy.items()
        }
    pairs = {n: n.replace(".default.", f".{REFERENCE_ADAPTER}.") for n in policy if ".default." in n}
    reference = {n: policy[ref].detach().clone() for n, ref in pairs.items() if ref in policy}
    return reference, {n: policy[n].detach().clone() for n in reference}


class Inspect(TrainerCallback):
    """After the reset callback at the end of each optimizer step: the reference, the policy and the optimizer's
    per-parameter state (how many parameters have one, and the largest AdamW step count)."""

    def __init__(self, trainer):
        self.trainer, self.seen = trainer, {}
        trainer.add_callback(self)

    def on_step_end(self, args, state, control, **kwargs):
        reference, policy = reference_and_policy(self.trainer)
        optimizer = innermost_optimizer(self.trainer.optimizer)
        steps = [float(s["step"]) for s in optimizer.state.values() if "step" in s]
        self.seen[state.global_step] = dict(
            reference=reference,
            policy=policy,
            optimizer_entries=len(optimizer.state),
            max_adam_step=max(steps, default=0.0),
            adapters=sorted(getattr(self.trainer.model, "peft_config", {})),
        )


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tolerance) -> None:
    assert a and sorted(a) == sorted(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tolerance)


def _differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[name], b[name]) for name in a)


# ------------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reference_reset_steps": 0}, r"reference_reset_steps must be a positive integer .* got 0"),
        ({"reference_reset_steps": True}, r"reference_reset_steps must be an int, got True"),
        ({"reference_reset_kl": 0.0}, r"reference_reset_kl must be a positive finite number or None, got 0.0"),
        ({"reference_reset_kl": float("inf")}, r"reference_reset_kl must be a positive finite number"),
        (
            {"reference_reset_steps": 2, "beta": 0.0},
            r"reference_reset_steps=2, reference_reset_kl=None resets the KL reference, but beta=0.0",
        ),
        (
            {"reference_reset_steps": 2, "beta": 0.1, "sync_ref_model": True},
            r"reference_reset_steps=2.* sync_ref_model=True also moves",
        ),
        (
            {"reference_reset_kl": 0.1, "beta": 0.1, "kl_in_reward": True},
            r"reference_reset_kl=0.1 reads the KL of the loss, which kl_in_reward=True",
        ),
        (
            {"reference_reset_kl": 0.1, "beta": 0.1, "advantage_estimator": "reinforce_pp"},
            r"reference_reset_kl=0.1 reads the KL of the loss, which advantage_estimator='reinforce_pp' puts",
        ),
    ],
    ids=[
        "steps_zero",
        "steps_bool",
        "kl_zero",
        "kl_inf",
        "beta_zero",
        "sync_ref_model",
        "kl_in_reward",
        "kl_in_return",
    ],
)
def test_reset_config_errors_name_the_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tr.ReasoningConfig(**cpu_args(**kwargs))


def test_the_reset_is_off_unless_a_field_asks_for_it():
    config = tr.ReasoningConfig(**cpu_args(beta=0.1))
    assert (config.reference_reset_steps, config.reference_reset_kl) == (None, None)
    # with RLOO's KL in the reward the schedule still applies (only the KL trigger reads the loss's KL)
    assert tr.RLOOConfig(**cpu_args(reference_reset_steps=5)).reference_reset_steps == 5


# ------------------------------------------------------------------------------------------------------ units


@pytest.mark.parametrize("engine", ["is_deepspeed_enabled", "is_fsdp_enabled"])
def test_deepspeed_and_fsdp_refuse_the_reset_by_name(engine):
    host = SimpleNamespace(args=SimpleNamespace(reference_reset_steps=200, reference_reset_kl=None), **{engine: True})
    with pytest.raises(
        ReferenceResetError, match=r"reference_reset_steps=200 / reference_reset_kl=None: .* DeepSpeed"
    ):
        reference_reset_for(host)
    host.args.reference_reset_steps = None  # off: nothing to refuse
    assert reference_reset_for(host) is None


def test_the_optimizer_state_is_dropped_inside_a_wrapper_and_rebuilt_as_at_the_first_step():
    """(The training tests below reset accelerate's own ``AcceleratedOptimizer``.)"""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3))]
    adamw = torch.optim.AdamW(params, lr=0.1)
    optimizer = SimpleNamespace(optimizer=adamw, step=adamw.step)  # a wrapper that keeps it as .optimizer
    for _ in range(3):
        params[0].grad = torch.ones(3)
        optimizer.step()
    assert innermost_optimizer(optimizer).state[params[0]]["step"] == 3
    assert reset_optimizer_state(optimizer) == 1
    assert len(innermost_optimizer(optimizer).state) == 0
    before = params[0].detach().clone()
    params[0].grad = torch.ones(3)
    optimizer.step()
    # AdamW's first step moves every coordinate by lr * sign(grad) (bias-corrected moments), plus weight decay
    state = innermost_optimizer(optimizer).state[params[0]]
    assert state["step"] == 1
    torch.testing.assert_close(params[0].detach(), before * (1 - 0.1 * 0.01) - 0.1, rtol=0, atol=1e-5)


def _deciding(every=None, threshold=None, step_counter=4, per_rollout=2):
    host = SimpleNamespace(
        args=SimpleNamespace(steps_per_generation=per_rollout),
        num_iterations=1,
        _step=step_counter,
        accelerator=SimpleNamespace(device="cpu", reduce=lambda tensor, reduction: tensor),
    )
    return ReferenceReset(host, every, threshold)


def test_a_reset_is_due_on_its_schedule_at_rollout_boundaries_only():
    reset = _deciding(every=3)
    assert reset.at_rollout_boundary()
    assert not reset.due(2) and reset.due(3) and reset.due(4)  # 4: the first boundary once 3 steps have passed
    reset.state.last_reset_step = 4
    assert not reset.due(6) and reset.due(7)
    assert not _deciding(every=3, step_counter=5).at_rollout_boundary()  # inside a rollout batch of 2 micro-batches


def test_the_kl_trigger_reads_the_mean_kl_of_the_rollout_batch_just_trained():
    reset = _deciding(threshold=0.05)
    for kl in (0.02, 0.06):  # mean 0.04
        reset.observe_kl(kl)
    assert not reset.due(2)
    assert reset.state.kl_count == 0  # each rollout batch is judged on its own
    for kl in (0.05, 0.07):
        reset.observe_kl(kl)
    assert reset.due(4)
    assert not reset.due(6)  # nothing observed: no KL, no trigger


def test_a_restored_checkpoint_drops_the_kl_of_a_rollout_batch_it_will_sample_again(tmp_path):
    """A checkpoint inside a rollout batch holds that batch's KL so far; the resumed run samples the batch again, so
    its KL trigger must not add the old batch's partial KL to the new one."""
    (tmp_path / REFERENCE_STATE_FILE).write_text(
        json.dumps({"resets": 0, "last_reset_step": None, "kl_sum": 0.3, "kl_count": 2})
    )
    reset = _deciding(threshold=0.05)
    reset.restore(tmp_path)
    assert (reset.state.kl_sum, reset.state.kl_count) == (0.0, 0)
    reset.observe_kl(0.04)
    assert not reset.due(2)  # judged on the new batch's 0.04 alone, not (0.3 + 0.04) / 3


# ------------------------------------------------------------------------------------------------------ training


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_the_reset_at_step_n_copies_the_policy_and_clears_the_optimizer(use_lora, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, peft=use_lora, reference_reset_steps=2, max_steps=4)
    if use_lora:  # before any reset TRL's reference is the base model: adapters disabled, no "ref" adapter
        assert REFERENCE_ADAPTER not in trainer.model.peft_config
    seen = Inspect(trainer).seen
    trainer.train()
    assert logged_metric(trainer, "reference/resets") == [0.0, 1.0, 1.0, 2.0]
    assert logged_metric(trainer, "reference/last_reset_step") == [2.0, 2.0, 4.0]
    # step 1: no reset; AdamW has stepped every trainable parameter once
    assert seen[1]["optimizer_entries"] > 0 and seen[1]["max_adam_step"] == 1.0
    if use_lora:
        assert seen[1]["adapters"] == ["default"] and seen[1]["reference"] == {}
    else:
        assert _differ(seen[1]["reference"], seen[1]["policy"])  # still the initial model
    # step 2 ends a rollout batch: reference := policy, optimizer state dropped
    _assert_same(seen[2]["reference"], seen[2]["policy"], rtol=0, atol=0)
    assert seen[2]["optimizer_entries"] == 0
    if use_lora:
        assert seen[2]["adapters"] == ["default", REFERENCE_ADAPTER]
        trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
        assert trained and not any(f".{REFERENCE_ADAPTER}." in n for n in trained)  # the copy is frozen
    # step 3: the optimizer starts over (step count 1), the reference stays the step-2 policy
    assert seen[3]["max_adam_step"] == 1.0
    _assert_same(seen[3]["reference"], seen[2]["policy"], rtol=0, atol=0)
    # the KL to the reference is 0 at the first scoring after the reset, and was not just before it
    kl = dict(zip(range(1, 5), logged_metric(trainer, "kl"), strict=True))
    assert kl[2] > 1e-6 and abs(kl[3]) < 1e-7, kl


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_every_train_call_resets_on_the_same_schedule(use_lora, tiny_model_path, tmp_path):
    """``train()`` three times on one trainer (the Trainer's step restarts at 0 each time): each resets at steps 2
    and 4 of its own, clears the optimizer and brings the KL back to 0, as the first does."""
    trainer = _trainer(tiny_model_path, tmp_path, peft=use_lora, reference_reset_steps=2, max_steps=4)
    resets, kls = [], []
    for _ in range(3):
        trainer.train()
        resets.append(logged_metric(trainer, "reference/resets"))
        kls.append(logged_metric(trainer, "kl"))
    assert resets == [[0.0, 1.0, 1.0, 2.0], [2.0, 3.0, 3.0, 4.0], [4.0, 5.0, 5.0, 6.0]]
    for kl in kls:  # the step after each reset scores against the policy just copied
        assert abs(kl[2]) < 1e-7, kl
    assert logged_metric(trainer, "reference/last_reset_step")[-1] == 4.0


@pytest.mark.slow
def test_no_reset_when_the_fields_are_none(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, reference_reset_steps=None, max_steps=2)
    assert trainer.reference_reset is None
    initial = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    _assert_same({n: p.detach() for n, p in trainer.ref_model.named_parameters()}, initial, rtol=0, atol=0)
    assert logged_metric(trainer, "reference/resets") == []
    assert not (tmp_path / "checkpoint-2" / REFERENCE_STATE_FILE).exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("threshold", "resets"), [(1e-9, [0.0, 1.0]), (1e3, [0.0, 0.0])], ids=["passed", "not_passed"]
)
def test_the_kl_trigger_resets_after_a_rollout_batch_over_the_threshold(threshold, resets, tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path, tmp_path, reference_reset_steps=None, reference_reset_kl=threshold, max_steps=2
    )
    trainer.train()
    assert max(logged_metric(trainer, "kl")) > 1e-9  # the second step's policy has moved away from the reference
    assert logged_metric(trainer, "reference/resets") == resets


def _resumable(model_path, output_dir, use_lora, stop_at=None, resume=None) -> tr.ReasoningTrainer:
    # resets at steps 4 and 8; checkpoint-6 lies after the first one, between two rollout batches
    trainer = _trainer(model_path, output_dir, peft=use_lora, reference_reset_steps=4, max_steps=7, beta=0.5)
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _lora_with_dropout():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True, "dropout"], ids=["full", "lora", "lora-dropout"])
def test_a_run_that_resets_then_checkpoints_resumes_as_the_uninterrupted_run(use_lora, tiny_model_path, tmp_path):
    """``lora-dropout``: PEFT's common ``lora_dropout=0.1``; the reference is scored without it after a resume as
    before (the Trainer used to load a checkpoint's ``ref/`` adapter with its dropout)."""
    if use_lora == "dropout":
        use_lora = _lora_with_dropout()
    full = _resumable(tiny_model_path, tmp_path / "full", use_lora)
    _resumable(tiny_model_path, tmp_path / "split", use_lora, stop_at=6)
    checkpoint = tmp_path / "split" / "checkpoint-6"
    state = json.loads((checkpoint / REFERENCE_STATE_FILE).read_text())
    assert (state["resets"], state["last_reset_step"]) == (1, 4)
    saved = load_file(str(checkpoint / REFERENCE_WEIGHTS_FILE))
    resumed = _resumable(tiny_model_path, tmp_path / "split", use_lora, resume=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 7
    assert resumed.reference_reset.state == full.reference_reset.state
    full_reference, full_policy = reference_and_policy(full)
    resumed_reference, resumed_policy = reference_and_policy(resumed)
    # the reference of step 4 was saved, restored and kept (it is not the step-6 policy of the checkpoint)
    _assert_same(resumed_reference, {name: saved[name] for name in resumed_reference}, rtol=0, atol=0)
    _assert_same(resumed_reference, full_reference, rtol=0, atol=0)
    assert _differ(full_reference, full_policy)
    _assert_same(resumed_policy, full_policy, rtol=1e-5, atol=1e-6)
    if use_lora:  # the reference adapter is training state: in the reset's own file, not a folder of the model
        assert not (checkpoint / REFERENCE_ADAPTER).exists()
        resumed.save_model(str(tmp_path / "final"))
        assert (tmp_path / "final" / "adapter_model.safetensors").is_file()
        assert not (tmp_path / "final" / REFERENCE_ADAPTER).exists()
        dropouts = [
            m.p
            for n, m in resumed.model.named_modules()
            if n.endswith(f".{REFERENCE_ADAPTER}") and isinstance(m, torch.nn.Dropout)
        ]
        assert all(p == 0.0 for p in dropouts) and (bool(dropouts) == (use_lora is not True))


@pytest.mark.slow
def test_a_damaged_reference_file_is_named_and_passed_over_by_resume_true(tiny_model_path, tmp_path):
    run = dict(reference_reset_steps=4, max_steps=7, beta=0.5, save_strategy="steps", save_steps=3)
    _trainer(tiny_model_path, tmp_path, **run).train()  # checkpoints 3, 6 and the final 7; the reset at step 4
    newest = tmp_path / "checkpoint-7"
    weights = newest / REFERENCE_WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut off
    with pytest.raises(ValueError, match=rf"{REFERENCE_WEIGHTS_FILE} is damaged \(it holds"):
        _trainer(tiny_model_path, tmp_path, **run).train(resume_from_checkpoint=str(newest))
    resumed = _trainer(tiny_model_path, tmp_path, **run)
    with pytest.warns(UserWarning, match=rf"passes over .*checkpoint-7.*{REFERENCE_WEIGHTS_FILE} is damaged"):
        resumed.train(resume_from_checkpoint=True)  # from checkpoint-6, past the reset: its reference is restored
    assert resumed.state.global_step == 7 and resumed.reference_reset.state.resets == 1


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
def test_a_resume_with_the_reset_turned_off_keeps_the_checkpoints_reference(use_lora, tiny_model_path, tmp_path):
    """The reference a run reset to is trainer state: resumed with both reset fields off, the run goes on against it
    (with a warning), never resets again, and its own checkpoints keep it."""
    reset_run = dict(peft=use_lora, max_steps=2, save_strategy="steps", save_steps=2)
    _trainer(tiny_model_path, tmp_path, reference_reset_steps=2, **reset_run).train()
    checkpoint = tmp_path / "checkpoint-2"
    saved = load_file(str(checkpoint / REFERENCE_WEIGHTS_FILE))
    trainer = _trainer(tiny_model_path, tmp_path, peft=use_lora, max_steps=4, save_strategy="steps", save_steps=4)
    assert trainer.reference_reset is None
    with pytest.warns(UserWarning, match=r"records 1 reference reset\(s\) .* against the checkpoint's reference"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    reference, policy = reference_and_policy(trainer)
    _assert_same(reference, {name: saved[name] for name in reference}, rtol=0, atol=0)
    assert _differ(reference, policy)  # two more steps trained, no reset
    assert (trainer.reference_reset.state.resets, trainer.reference_reset.state.last_reset_step) == (1, 2)
    state = json.loads((tmp_path / "checkpoint-4" / REFERENCE_STATE_FILE).read_text())
    assert (state["resets"], state["last_reset_step"]) == (1, 2)
    assert (tmp_path / "checkpoint-4" / REFERENCE_WEIGHTS_FILE).is_file()


@pytest.mark.slow
def test_a_checkpoint_that_lost_its_reference_weights_is_refused_by_name(tiny_model_path, tmp_path):
    _trainer(
        tiny_model_path, tmp_path, reference_reset_steps=2, max_steps=2, save_strategy="steps", save_steps=2
    ).train()
    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / REFERENCE_WEIGHTS_FILE).unlink()
    trainer = _trainer(tiny_model_path, tmp_path, reference_reset_steps=2, max_steps=3)
    with pytest.raises(
        ReferenceResetError, match=rf"records 1 reference reset\(s\) but has no {REFERENCE_WEIGHTS_FILE}"
    ):
        trainer.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["inline", "process"])
def test_an_asynchronous_run_scores_the_reference_with_the_trainers_weights(tiny_model_path, tmp_path, generator):
    """Each batch is sampled by the weights of the step before (k = 1), but the reference forward is the trainer's:
    reset at every step, the reference is the policy the loss starts from, so the KL is 0 at every step. A generator
    process sampling ahead holds no reference (it is shipped the trainable weights only): the same holds."""
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        steps_per_generation=1,
        per_device_train_batch_size=8,
        reference_reset_steps=1,
        async_rollouts=True,
        async_generator=generator,
        max_staleness=1,
    )
    trainer.train()
    assert logged_metric(trainer, "async/staleness") == [0.0, 1.0, 1.0]
    assert logged_metric(trainer, "reference/resets") == [1.0, 2.0, 3.0]
    assert all(abs(kl) < 1e-7 for kl in logged_metric(trainer, "kl")), logged_metric(trainer, "kl")


@pytest.mark.slow
def test_two_processes_reset_at_the_same_steps(tiny_model_path, tmp_path):
    """The KL trigger under two gloo processes: the KL each rank reads is averaged over both, and the decision is
    reduced across them, so both reset at the same steps and end with the same reference and policy."""
    run_torchrun(WORKER, tiny_model_path, str(tmp_path), timeout=300)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in reports] == [2, 2]
    # step 1 trains on the reference itself (KL 0), step 2 has left it (reset), step 3 starts from it again (KL 0)
    assert reports[0]["resets"] == reports[1]["resets"] == [0.0, 1.0, 1.0, 2.0]
    assert reports[0]["last_reset_step"] == reports[1]["last_reset_step"] == [2.0, 2.0, 4.0]
    for key in ("reference_checksum", "parameter_checksum"):
        assert math.isfinite(reports[0][key]) and reports[0][key] == reports[1][key], key
