"""Journey: the trainer's own checkpoint file, ``trl_reasoning_sampling_state.json``, is as safe as the Trainer's.

What a hostile user did to it (issue 25), each followed past the fault: a kill while the file was being written,
then ``resume_from_checkpoint=True``; the file empty, truncated, ``{}`` or missing; a resume with a smaller dataset;
a hub push of the checkpoint; and a run that retires every prompt, then saves the model.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from conftest import cpu_args, make_prompts, message_text
from transformers.trainer_callback import TrainerState

import trl_reasoning as tr
from journeys._helpers import checkpoint_steps, journey_args, step_losses
from trl_reasoning.trainer.checkpoints import (
    SAMPLING_STATE_FILE,
    SamplingStateError,
    checkpoint_problem,
    read_sampling_state,
    write_json_atomically,
)

pytestmark = [pytest.mark.journey, pytest.mark.filterwarnings("ignore::trl_reasoning.DynamicSamplingWarning")]


def sparse_reward(completions, **kwargs) -> list[float]:
    """1 when the completion has two or more '1's: rare for the tiny model, so DAPO's dynamic sampling draws extra
    prompts from its stream (whose position goes into the sampling state)."""
    return [float(message_text(c).count("1") >= 2) for c in completions]


def always_passes(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


def _dapo(model_path, output_dir, dataset=None, **overrides) -> tr.DAPOTrainer:
    args = tr.DAPOConfig(**journey_args(output_dir, max_num_gen_batches=4, **overrides))
    return tr.DAPOTrainer(
        model=model_path,
        reward_funcs=sparse_reward,
        args=args,
        train_dataset=make_prompts(16) if dataset is None else dataset,
    )


def _parameters(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


# ------------------------------------------------------------------------------------------------ writing the file


def test_the_sampling_state_is_written_before_trainer_state_and_before_the_push(
    tiny_model_path, tmp_path, monkeypatch
):
    trainer = _dapo(tiny_model_path, tmp_path / "run", max_steps=2)
    seen = {"trainer_state": [], "push": []}
    save_to_json = TrainerState.save_to_json

    def checked_save(state, path):
        folder = Path(path).parent
        seen["trainer_state"].append(json.loads((folder / SAMPLING_STATE_FILE).read_text()))
        save_to_json(state, path)

    monkeypatch.setattr(TrainerState, "save_to_json", checked_save)
    # The hub push replaced by a stand-in that lists the folder it is handed (hub_strategy="checkpoint").
    trainer.args.push_to_hub, trainer.args.hub_strategy = True, "checkpoint"
    monkeypatch.setattr(
        trainer, "_push_from_checkpoint", lambda folder: seen["push"].append(sorted(os.listdir(folder)))
    )
    trainer.train()
    assert len(seen["trainer_state"]) == 1 and "prompt_stream" in seen["trainer_state"][0]
    assert len(seen["push"]) == 1 and SAMPLING_STATE_FILE in seen["push"][0]
    assert "trainer_state.json" in seen["push"][0]


def test_an_interrupted_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / SAMPLING_STATE_FILE
    write_json_atomically(path, {"retired_prompts": {"epoch_of": {"a": 0}}})

    def dies_half_way(data, file):
        file.write('{"retired_prompts": {"epo')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", dies_half_way)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomically(path, {"retired_prompts": {"epoch_of": {"a": 0, "b": 1}}})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"retired_prompts": {"epoch_of": {"a": 0}}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [SAMPLING_STATE_FILE]  # no temporary file left


KILLED_RUN = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path[:0] = [{tests!r}]
    from journeys.test_checkpoint_state import _dapo

    dump = json.dump

    def killed_while_writing(data, file, **kwargs):
        # The file being written (a temporary file in the checkpoint folder): die half way through checkpoint-4's.
        path = os.readlink(f"/proc/self/fd/{{file.fileno()}}")
        if os.path.basename(os.path.dirname(path)) == "checkpoint-4":
            file.write(json.dumps(data)[:20])
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        dump(data, file, **kwargs)

    json.dump = killed_while_writing
    _dapo({model!r}, {output!r}).train()
    """
)


@pytest.mark.slow
def test_killed_while_writing_then_resume_true_takes_the_last_complete_checkpoint(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    script = KILLED_RUN.format(tests=str(Path(__file__).parents[1]), model=tiny_model_path, output=str(run))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    # checkpoint-4 holds a partly written temporary file and no trainer_state.json: it looks like a checkpoint
    # folder, but it is not a complete one.
    assert checkpoint_steps(run) == [2, 4]
    assert not (run / "checkpoint-4" / "trainer_state.json").exists()

    resumed = _dapo(tiny_model_path, run)
    with pytest.warns(UserWarning, match=r"passes over .*checkpoint-4: it has no trainer_state.json") as caught:
        resumed.train(resume_from_checkpoint=True)
    assert any("Resuming from" in str(w.message) and "checkpoint-2" in str(w.message) for w in caught)
    assert resumed.state.global_step == 5

    uninterrupted = _dapo(tiny_model_path, tmp_path / "uninterrupted")
    uninterrupted.train()
    assert step_losses(resumed)[5] == pytest.approx(step_losses(uninterrupted)[5], rel=1e-5, abs=1e-7)
    for a, b in zip(_parameters(resumed), _parameters(uninterrupted), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert resumed.sampling_state_dict() == uninterrupted.sampling_state_dict()


def test_resume_true_passes_over_a_checkpoint_whose_trainer_state_is_cut_off(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    _dapo(tiny_model_path, run, max_steps=4).train()
    state = run / "checkpoint-4" / "trainer_state.json"
    state.write_text(state.read_text()[:40])
    resumed = _dapo(tiny_model_path, run)
    with pytest.warns(UserWarning, match=r"checkpoint-4: its trainer_state.json is not valid JSON"):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 5


def test_resume_true_with_no_complete_checkpoint_is_trls_error(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    trainer = _dapo(tiny_model_path, run)
    with pytest.warns(UserWarning, match="passes over"), pytest.raises(ValueError, match="No valid checkpoint found"):
        trainer.train(resume_from_checkpoint=True)


# ------------------------------------------------------------------------------------------------ reading the file


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "is empty"),
        ('{"retired_prompts": {"epoch_of": {}}, "prompt_str', "is not valid JSON"),
        ("{}", "lacks retired_prompts, prompt_stream, sampler_epoch"),
        ("[1, 2]", "holds a list"),
        ('{"retired_prompts": [], "prompt_stream": null, "sampler_epoch": 0}', "malformed 'retired_prompts'"),
    ],
    ids=["empty", "truncated", "empty_object", "wrong_type", "malformed"],
)
def test_a_damaged_sampling_state_is_an_error_that_names_the_file_and_the_way_out(
    content, problem, tiny_model_path, tmp_path
):
    run = tmp_path / "run"
    _dapo(tiny_model_path, run, max_steps=2).train()
    path = run / "checkpoint-2" / SAMPLING_STATE_FILE
    path.write_text(content)
    resumed = _dapo(tiny_model_path, run)
    with pytest.raises(SamplingStateError) as info:
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    message = str(info.value)
    assert str(path) in message and problem in message
    assert "Resume from an earlier checkpoint, or delete" in message


_VALID_STATE = {"retired_prompts": {"epoch_of": {"k": 0}}, "prompt_stream": None, "sampler_epoch": 1}


@pytest.mark.parametrize(
    ("changes", "entry"),
    [
        ({"retired_prompts": {}}, "retired_prompts"),
        ({"retired_prompts": {"epoch_of": {"k": "zero"}}}, "retired_prompts"),
        ({"prompt_stream": {"remaining": [1, 2]}}, "prompt_stream"),
        ({"prompt_stream": {"passes": 1, "remaining": [1, None]}}, "prompt_stream"),
        ({"prompt_stream": {"passes": 1, "streamed": True}}, "prompt_stream"),
        ({"sampler_epoch": "1"}, "sampler_epoch"),
        ({"num_samples": 2.5}, "num_samples"),
    ],
    ids=[
        "no_epoch_of",
        "epoch_not_int",
        "stream_no_passes",
        "stream_bad_index",
        "stream_no_position",
        "epoch",
        "size",
    ],
)
def test_a_well_formed_json_with_a_damaged_entry_is_refused_by_name(changes, entry, tmp_path):
    """Valid JSON whose entries are not what the trainer writes is refused before anything is loaded (it would fail
    later with a bare KeyError or int() error naming no file), and resume_from_checkpoint=True passes it over."""
    (tmp_path / SAMPLING_STATE_FILE).write_text(json.dumps({**_VALID_STATE, **changes}))
    with pytest.raises(SamplingStateError, match=rf"{SAMPLING_STATE_FILE} has a malformed '{entry}' entry"):
        read_sampling_state(tmp_path)
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("")
    assert "cannot be read" in checkpoint_problem(tmp_path)


def test_a_well_formed_state_is_read_and_a_file_of_bytes_is_a_named_error(tmp_path):
    path = tmp_path / SAMPLING_STATE_FILE
    for stream in (None, {"passes": 1, "remaining": [0, 3]}, {"passes": 2, "position": 5, "streamed": True}):
        path.write_text(json.dumps({**_VALID_STATE, "prompt_stream": stream, "num_samples": 4}))
        assert read_sampling_state(tmp_path)["prompt_stream"] == stream
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SamplingStateError, match=rf"{SAMPLING_STATE_FILE} cannot be read \(UnicodeDecodeError"):
        read_sampling_state(tmp_path)


def test_the_state_file_is_readable_as_any_file_the_trainer_writes(tmp_path):
    """Not mkstemp's 0600: a resume by another user (a shared output_dir, another container UID) can read it."""
    umask = os.umask(0o022)
    try:
        write_json_atomically(tmp_path / SAMPLING_STATE_FILE, _VALID_STATE)
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / SAMPLING_STATE_FILE).stat().st_mode) == 0o644


def test_a_missing_sampling_state_is_a_warning_that_names_the_file(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    _dapo(tiny_model_path, run, max_steps=2).train()
    (run / "checkpoint-2" / SAMPLING_STATE_FILE).unlink()  # a checkpoint copied by hand without it
    resumed = _dapo(tiny_model_path, run)
    with pytest.warns(UserWarning, match=rf"{SAMPLING_STATE_FILE} is missing.*extra-prompt stream") as caught:
        resumed.train(resume_from_checkpoint=True)
    assert str(run / "checkpoint-2") in str(caught[0].message)
    assert resumed.state.global_step == 5


@pytest.mark.slow
def test_dapo_resumed_with_a_smaller_dataset_warns_and_trains_to_the_end(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    first = _dapo(tiny_model_path, run, dataset=make_prompts(16))
    first.train()
    saved = json.loads((run / "checkpoint-4" / SAMPLING_STATE_FILE).read_text())
    assert saved["prompt_stream"] is not None and max(saved["prompt_stream"]["remaining"]) >= 4

    smaller = make_prompts(4)
    resumed = _dapo(tiny_model_path, run, dataset=smaller)
    with pytest.warns(UserWarning, match=r"has 4 prompts, the checkpoint's extra-prompt stream was drawn from 16"):
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-4"))
    assert resumed.state.global_step == 5
    assert all(0 <= index < 4 for index in resumed.sampling_state_dict()["prompt_stream"]["remaining"])


# ------------------------------------------------------------------------------------------------ retirement


def _scalerl(model_path, output_dir, reward, dataset=None, **overrides):
    args = tr.ScaleRLConfig(**journey_args(output_dir, **overrides))
    return tr.ScaleRLTrainer(
        model=model_path, reward_funcs=reward, args=args, train_dataset=make_prompts(4) if dataset is None else dataset
    )


@pytest.mark.slow
def test_retiring_every_prompt_ends_training_cleanly_then_save_model_runs(tiny_model_path, tmp_path):
    # 4 prompts, 2 a step: epoch 0 is steps 1-2 and retires every prompt (pass rate 1 >= 0.9).
    run = tmp_path / "run"
    trainer = _scalerl(tiny_model_path, run, always_passes, max_steps=8, save_steps=5)
    with pytest.warns(UserWarning, match=r"retired every training prompt.*ends at step 2 of 8.*final checkpoint"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert checkpoint_steps(run) == [2]  # the final checkpoint, as at a normal end
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "config.json").exists()
    # Resuming from that final checkpoint has nothing left to train: it ends at once, again cleanly.
    resumed = _scalerl(tiny_model_path, run, always_passes, max_steps=8, save_steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2


@pytest.mark.slow
def test_an_always_positive_reward_retires_nothing_and_trains_every_epoch_as_trl(tiny_model_path, tmp_path):
    def length_reward(completions, **kwargs) -> list[float]:  # TRL's tests' kind of reward: always > 0
        return [0.1 + len(message_text(c)) / 20 for c in completions]

    trainer = _scalerl(tiny_model_path, tmp_path / "run", length_reward, max_steps=6)
    with pytest.warns(UserWarning, match=r"no prompt is retired.*Set task_pass_threshold"):
        trainer.train()
    assert trainer.state.global_step == 6 and trainer.state.epoch >= 3
    assert len(trainer.sampling_state_dict()["retired_prompts"]["epoch_of"]) == 0
    suspended = [h for h in trainer.state.log_history if "group_selection/retirement_suspended" in h]
    assert suspended and all(h["group_selection/retirement_suspended"] == 1.0 for h in suspended)

    # With a pass threshold of its own the same reward retires the prompts whose completions reach it.
    with_threshold = _scalerl(
        tiny_model_path, tmp_path / "threshold", length_reward, max_steps=2, task_pass_threshold=0.3
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "suspended" warning
        with_threshold.train()
    assert len(with_threshold.sampling_state_dict()["retired_prompts"]["epoch_of"]) > 0


@pytest.mark.slow
def test_a_reward_seen_to_be_graded_suspends_retirement_for_the_rest_of_the_run(tiny_model_path, tmp_path):
    """A pass is "task reward > 0" only for a correctness reward: once a batch shows a graded value (0.5), a later
    batch that happens to hold only 0 and 1 retires nothing either."""
    calls = []

    def sometimes_graded(completions, **kwargs) -> list[float]:
        calls.append(len(calls))
        return [0.5 if len(calls) == 2 else 1.0] * len(completions)

    trainer = _scalerl(tiny_model_path, tmp_path / "run", sometimes_graded, max_steps=5, save_steps=5)
    with pytest.warns(UserWarning, match=r"returned 0.5, so no prompt is retired from now on \(2 were before"):
        trainer.train()
    assert trainer.state.global_step == 5, "the last prompts were retired by a binary-looking batch"
    assert len(trainer.sampling_state_dict()["retired_prompts"]["epoch_of"]) == 2


def test_no_positive_resampling_config_takes_a_pass_threshold(tmp_path):
    args = tr.ScaleRLConfig(**cpu_args(output_dir=str(tmp_path), task_pass_threshold=0.8))
    assert args.task_pass_threshold == 0.8 and args.positive_resampling_threshold == 0.9
