"""Asynchronous memory: O(k sampled batches), not O(k copies of the weights).

What is checked: a run whose batches can be sampled ahead (the batch of step ``g + k`` at step ``g``, as soon as its
behaviour weights exist) keeps no snapshot of its weights, in RAM or in its checkpoints, but the sampled batches,
for a full fine-tune and for LoRA, in the training process and in a generator process; at an epoch boundary it keeps
only the weights of the next epoch's first batches, until they are sampled, and the lag stays exact; the features
that truly need snapshots keep the last ``k + 1``; and a checkpoint of the earlier format (``k + 1`` snapshots)
resumes as the uninterrupted run.
"""

from __future__ import annotations

import pytest
import torch
from conftest import StopAt, cpu_args, digit_fraction, logged_metric, logps_under, lora_config, make_prompts
from transformers import AutoModelForCausalLM, TrainerCallback

import trl_reasoning as tr
from trl_reasoning.async_rollouts.behaviour import ASYNC_STATE_FORMAT, BEHAVIOUR_WEIGHTS_FILE, trainable_parameters


def _trainer(model_path, tmp_path, prompts=16, peft_config=None, **overrides):
    settings = dict(async_rollouts=True, max_staleness=2, max_steps=5)
    settings.update(overrides)
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), **settings))
    return tr.ReasoningTrainer(
        model=model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(prompts),
        peft_config=peft_config,
    )


class KeptSnapshots(TrainerCallback):
    """The generation steps whose weights the trainer keeps, at the end of each optimizer step; and the weights at
    each generation step (the model's, recorded as the step begins)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.kept: list[list[int]] = []
        self.weights: list[dict[str, torch.Tensor]] = []
        record = trainer.async_rollouts.behaviour.record

        def recorded(params):
            self.weights.append({name: p.detach().clone() for name, p in params.items()})
            return record(params)

        trainer.async_rollouts.behaviour.record = recorded

    def on_step_end(self, args, state, control, **kwargs):
        self.kept.append(self.trainer.async_rollouts.behaviour.kept_steps)


@pytest.mark.parametrize(
    ("generator", "lora"), [("inline", False), ("inline", True), ("process", False)], ids=["full", "lora", "process"]
)
def test_a_run_that_samples_ahead_keeps_batches_not_weights(generator, lora, tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        peft_config=lora_config() if lora else None,
        async_generator=generator,
        save_strategy="steps",
        save_steps=3,
    )
    assert trainer.async_rollouts.snapshot_reason is None and not trainer.async_rollouts.behaviour.keep_all
    kept = KeptSnapshots(trainer)
    trainer.add_callback(kept)
    trainer.train()
    # no snapshot but the weights of the first batch after train() (of step 5, sampled by those of step 3)
    assert kept.kept == [[], [], [], [3], [3]], "weights were snapshotted"
    assert logged_metric(trainer, "async/staleness") == [0, 1, 2, 2, 2]
    state = torch.load(tmp_path / "checkpoint-3" / BEHAVIOUR_WEIGHTS_FILE, weights_only=True)
    assert state["format"] == ASYNC_STATE_FORMAT and state["snapshots"] == [] and state["generation_steps"] == 3
    # the batches of steps 3 and 4, sampled at steps 1 and 2 (by their weights), wait in the checkpoint
    assert sorted(state["batches"]) == [3, 4]
    for batch in state["batches"].values():
        assert len(batch["completion_ids"]) == len(batch["logprobs"]) == 8
        assert [len(ids) for ids in batch["completion_ids"]] == [len(row) for row in batch["logprobs"]]
    model_bytes = sum(p.numel() * p.element_size() for p in trainable_parameters(trainer.model).values())
    file_bytes = (tmp_path / "checkpoint-3" / BEHAVIOUR_WEIGHTS_FILE).stat().st_size
    assert file_bytes < 3 * model_bytes / 4, ("the earlier format held 3 snapshots", file_bytes, model_bytes)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (dict(dynamic_sampling=True, max_num_gen_batches=3), "dynamic sampling"),
        (dict(policy_loss="dppo", dppo_divergence="topk_tv", dppo_topk=4), "top-K"),
    ],
    ids=["dynamic-sampling", "dppo-topk"],
)
def test_the_features_that_need_snapshots_keep_the_last_k_plus_1(overrides, reason, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, max_steps=4, **overrides)
    assert reason in trainer.async_rollouts.snapshot_reason and trainer.async_rollouts.behaviour.keep_all
    kept = KeptSnapshots(trainer)
    trainer.add_callback(kept)
    trainer.train()
    assert kept.kept == [[0], [0, 1], [0, 1, 2], [1, 2, 3]]


def test_an_epoch_boundary_keeps_only_the_weights_of_the_next_epoch_s_first_batches(tiny_model_path, tmp_path):
    """8 prompts, 2 a step: an epoch is 4 steps, and the next epoch's prompts are drawn when it starts. The weights of
    steps 2 and 3 sample the batches of steps 4 and 5: they are kept until step 4 samples them, and every batch is
    still sampled by the weights of k steps earlier."""
    k = 2
    trainer = _trainer(tiny_model_path, tmp_path, prompts=8, max_steps=7, max_staleness=k)
    kept = KeptSnapshots(trainer)
    trainer.add_callback(kept)
    calls = []
    generate = trainer._generate

    def recorded(prompts):
        output = generate(prompts)
        calls.append((trainer.async_rollouts.behaviour.generation_steps - 1, output[0], output[1], output[4]))
        return output

    trainer._generate = recorded
    trainer.train()
    # ... and the weights of step 5, for the first batch after train() (of step 7)
    assert kept.kept == [[], [], [2], [2, 3], [], [5], [5]]
    assert logged_metric(trainer, "async/staleness") == [0, 1, 2, 2, 2, 2, 2]
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    for step, prompt_ids, completion_ids, logprobs in calls:
        expected = logps_under(
            reference, kept.weights[max(step - k, 0)], prompt_ids, completion_ids, trainer.temperature
        )
        for row, want in zip(logprobs, expected, strict=True):
            torch.testing.assert_close(torch.tensor(row, dtype=torch.float64), want, atol=1e-4, rtol=1e-4)


def test_a_checkpoint_of_the_earlier_format_resumes_as_the_uninterrupted_run(tiny_model_path, tmp_path):
    """A checkpoint written before the sampled batches were kept holds the last k + 1 snapshots: the resumed run
    samples the next k batches with them (then drops them) and trains as the uninterrupted run."""
    settings = dict(max_steps=6, max_staleness=2, save_strategy="steps", save_steps=3)
    full = _trainer(tiny_model_path, tmp_path / "full", **settings)
    full.train()

    first = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    kept = KeptSnapshots(first)
    first.add_callback(StopAt(3))
    first.train()
    checkpoint = tmp_path / "cut" / "checkpoint-3"
    # the earlier format: the snapshots of generation steps 0, 1 and 2, oldest first
    legacy = {"max_staleness": 2, "generation_steps": 3, "snapshots": kept.weights[:3]}
    torch.save(legacy, checkpoint / BEHAVIOUR_WEIGHTS_FILE)

    resumed = _trainer(tiny_model_path, tmp_path / "cut", **settings)
    resumed_kept = KeptSnapshots(resumed)
    resumed.add_callback(resumed_kept)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    # kept: the weights of step 4 only (for the first batch after train()), none of the earlier format's
    assert resumed_kept.kept == [[], [4], [4]], "the earlier format's snapshots were kept after they sampled"

    def after_step_3(trainer, name):
        return [e[name] for e in trainer.state.log_history if name in e and e["step"] > 3]

    assert after_step_3(resumed, "async/staleness") == [2, 2, 2]
    torch.testing.assert_close(
        torch.tensor(after_step_3(resumed, "loss")), torch.tensor(after_step_3(full, "loss")), atol=1e-5, rtol=1e-4
    )
    expected = dict(full.model.named_parameters())
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(param, expected[name], atol=1e-5, rtol=1e-4)


def test_a_checkpoint_without_the_batches_or_their_weights_restarts_the_pipeline(tiny_model_path, tmp_path):
    """A run that keeps snapshots (dynamic sampling's extra rounds) resumed from a checkpoint that kept batches
    instead: it cannot sample the next batches by the weights of k steps earlier, says so, and restarts."""
    settings = dict(max_steps=4, max_staleness=2, save_strategy="steps", save_steps=2)
    first = _trainer(tiny_model_path, tmp_path, **settings)
    first.add_callback(StopAt(2))
    first.train()
    other = _trainer(tiny_model_path, tmp_path, dynamic_sampling=True, max_num_gen_batches=2, **settings)
    with pytest.warns(UserWarning, match=r"generation step 2 \(the weights of step 0\) are not kept.*restarts"):
        other.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [e["async/staleness"] for e in other.state.log_history if "async/staleness" in e and e["step"] > 2] == [
        0,
        1,
    ]
