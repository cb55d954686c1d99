"""Journey: a streaming training set (`datasets.IterableDataset`) with dynamic sampling and no-positive-resampling.

TRL streams prompts through ``repeat_iterable_dataset``; DAPO's extra prompts come from the stream itself (a pass of
its own, reshuffled per pass, its position saved in checkpoints), and ScaleRL's retired prompts are filtered out of
the stream by prompt from the next epoch on. Each run goes past a checkpoint and resumes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import Recorder, make_prompts, message_text
from datasets import IterableDataset

import trl_reasoning as tr
from journeys._helpers import journey_args, step_losses
from trl_reasoning.algorithms.prompt_sampling import prompt_key

pytestmark = [pytest.mark.journey, pytest.mark.filterwarnings("ignore::trl_reasoning.DynamicSamplingWarning")]


def stream_of(rows: list[dict]) -> IterableDataset:
    def generate():
        yield from rows

    return IterableDataset.from_generator(generate)


def sparse_reward(completions, **kwargs) -> list[float]:
    return [float(message_text(c).count("1") >= 2) for c in completions]


def _dapo(model_path, output_dir, **overrides):
    args = tr.DAPOConfig(**journey_args(output_dir, max_num_gen_batches=4, **overrides))
    return tr.DAPOTrainer(
        model=model_path, reward_funcs=sparse_reward, args=args, train_dataset=stream_of(list(make_prompts(16)))
    )


@pytest.mark.slow
def test_dapo_draws_extra_prompts_from_the_stream_and_resumes_where_it_was(tiny_model_path, tmp_path):
    first = _dapo(tiny_model_path, tmp_path / "run")
    recorder = Recorder(first)
    first.train()
    rounds = [entry["group_selection/generation_rounds"] for entry in first.state.log_history if "loss" in entry]
    assert max(rounds) > 1, "no extra round was drawn: the journey does not exercise the stream"
    stream = first.sampling_state_dict()["prompt_stream"]
    assert stream["streamed"] and stream["passes"] >= 1
    assert len(recorder.batches) == 5

    resumed = _dapo(tiny_model_path, tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert step_losses(resumed)[5] == pytest.approx(step_losses(first)[5], rel=1e-5, abs=1e-7)
    for a, b in zip(resumed.model.parameters(), first.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert resumed.sampling_state_dict()["prompt_stream"] == stream


def _scalerl(model_path, output_dir, reward, rows, **overrides):
    args = tr.ScaleRLConfig(**journey_args(output_dir, **overrides))
    return tr.ScaleRLTrainer(model=model_path, reward_funcs=reward, args=args, train_dataset=stream_of(rows))


@pytest.mark.slow
def test_scalerl_leaves_retired_prompts_out_of_the_stream_from_the_next_epoch(tiny_model_path, tmp_path):
    rows = list(make_prompts(8))
    easy = {prompt_key(row["prompt"]) for row in rows[:4]}  # always solved: retired in the first epoch
    seen: list[tuple[int, str]] = []

    def reward(prompts, completions, **kwargs) -> list[float]:
        epoch = trainer.sampling_state_dict()["sampler_epoch"]  # a stream's epoch, as the trainer counts it
        values = []
        for i, prompt in enumerate(prompts):
            key = prompt_key(prompt)
            seen.append((epoch, key))
            values.append(1.0 if key in easy else float(i % 2))  # the others pass half the time
        return values

    trainer = _scalerl(tiny_model_path, tmp_path / "run", reward, rows, max_steps=8, save_steps=6)
    trainer.train()
    retired = trainer.sampling_state_dict()["retired_prompts"]["epoch_of"]
    assert set(retired) == easy and set(retired.values()) == {0}
    later = {key for epoch, key in seen if epoch >= 1}
    assert later and not (later & easy), "a prompt retired in epoch 0 was drawn again"
    assert trainer.state.global_step == 8


@pytest.mark.slow
def test_scalerl_on_a_stream_that_is_fully_retired_ends_cleanly(tiny_model_path, tmp_path):
    def always(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = _scalerl(tiny_model_path, tmp_path / "run", always, list(make_prompts(4)), max_steps=8, save_steps=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.global_step == 2
    assert any("retired every training prompt" in str(w.message) for w in caught)
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "config.json").exists()


@pytest.mark.slow
def test_scalerl_on_a_stream_resumed_after_retirements_trains_on_without_them(tiny_model_path, tmp_path):
    """A stream shorter than the run, resumed at step 6 after prompts were retired in epoch 0. The Trainer resumes a
    stream by skipping 6 steps' batches from its start, which uses up a whole pass: that epoch must not read as
    "every prompt retired" (the run ended at once), and the stream's epoch, which decides which retired prompts the
    stream leaves out, comes from the checkpoint (it restarted at 0, letting retired prompts back)."""
    rows = list(make_prompts(8))
    easy = {prompt_key(row["prompt"]) for row in rows[:4]}  # always solved: retired in epoch 0
    late = {prompt_key(row["prompt"]) for row in rows[4:6]}  # solved from epoch 1 on: retired in epoch 1
    seen: dict[str, list[tuple[int, int, str]]] = {"full": [], "resumed": []}
    trainers = {}

    def reward_for(name):
        def reward(prompts, completions, **kwargs) -> list[float]:
            trainer = trainers[name]
            epoch = trainer.sampling_state_dict()["sampler_epoch"]
            for prompt in prompts[:: trainer.num_generations]:
                seen[name].append((trainer.state.global_step, epoch, prompt_key(prompt)))
            solved = easy | late if epoch >= 1 else easy
            return [1.0 if prompt_key(p) in solved else float(i % 2) for i, p in enumerate(prompts)]

        reward.__name__ = "reward"
        return reward

    for name in ("full", "resumed"):
        trainers[name] = _scalerl(tiny_model_path, tmp_path / "run", reward_for(name), rows, max_steps=8, save_steps=6)
    trainers["full"].train()
    checkpoint_epoch = max(epoch for step, epoch, _ in seen["full"] if step < 6)
    assert checkpoint_epoch >= 1, "the run never left its first epoch: the check is vacuous"
    trainers["resumed"].train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-6"))
    assert trainers["resumed"].state.global_step == 8
    assert seen["resumed"] and min(epoch for _, epoch, _ in seen["resumed"]) >= checkpoint_epoch
    retired = trainers["full"].sampling_state_dict()["retired_prompts"]["epoch_of"]
    assert {retired[key] for key in late} == {1}, "no prompt was retired in epoch 1: the check is vacuous"
    assert not {key for _, _, key in seen["resumed"]} & (easy | late), (
        "a prompt retired before the checkpoint came back"
    )
