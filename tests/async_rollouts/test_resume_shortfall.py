"""A resume that restarts the asynchronous pipeline says the one reason that applies.

Resuming a one-process asynchronous checkpoint on two processes warned "holds neither the next batches nor their
weights (written with another generator, number of processes or dynamic-sampling setting)": every possible cause.
The checkpoint's state records its ``world_size``, ``format``, ``max_staleness``, kept snapshots and sampled
batches; ``resume_shortfall`` compares them with the resuming run and names what differs. The states here are what
``AsyncRollouts.save`` writes for ``max_staleness=2`` at generation step 3 (checked end to end by
``tests/async_rollouts/test_async_rollouts.py::test_a_resume_on_another_number_of_processes_names_that_cause``).
"""

from __future__ import annotations

import pytest
import torch

from trl_reasoning.async_rollouts.behaviour import (
    _RESUMED,
    ASYNC_STATE_FORMAT,
    BehaviourWeights,
    restart_pipeline,
    resume_shortfall,
)

DYNAMIC_SAMPLING = "dynamic sampling's extra rounds are sampled by the weights of k steps earlier"


def _state(world_size: int = 1, snapshot_steps: tuple = (), batches: tuple = (3, 4), **changes) -> dict:
    """A checkpoint of a run with k = 2 saved after generation step 2 (its next step is 3)."""
    state = {
        "max_staleness": 2,
        "generation_steps": 3,
        "first_step": 0,
        "snapshot_steps": list(snapshot_steps),
        "snapshots": [{"w": torch.full((2,), float(step))} for step in snapshot_steps],
        "format": ASYNC_STATE_FORMAT,
        "world_size": world_size,
        "batches": {step: {"prompts": [f"p{step}"]} for step in batches},
    }
    state.update(changes)
    return state


def _shortfall(state: dict, world_size: int = 1, keeps_snapshots: bool = False) -> str | None:
    """As ``AsyncRollouts.restore`` asks: a run that samples ahead, or one that keeps snapshots (dynamic sampling,
    ``async_generator="inline"``: no pipeline)."""
    return resume_shortfall(
        state,
        world_size=world_size,
        keep_all=keeps_snapshots,
        samples_ahead=not keeps_snapshots,
        snapshot_reason=DYNAMIC_SAMPLING if keeps_snapshots else None,
    )


def test_another_number_of_processes_is_the_one_cause_named():
    message = _shortfall(_state(world_size=1), world_size=2)
    assert message.startswith("was written by 1 process and this run has 2 processes:"), message
    assert "generation steps [3, 4]" in message and "Resume with 1 process " in message
    assert "async_generator" not in message and "dynamic" not in message and "max_steps" not in message
    assert _shortfall(_state(world_size=2), world_size=1).startswith("was written by 2 processes and this run has 1 ")


def test_a_checkpoint_that_gives_every_next_batch_names_nothing():
    assert _shortfall(_state()) is None  # same number of processes: its batches are trained on
    # a run that kept the last k + 1 snapshots gives the weights of every next batch, on any number of processes
    kept_all = _state(snapshot_steps=(0, 1, 2), batches=())
    assert _shortfall(kept_all, world_size=2) is None and _shortfall(kept_all, keeps_snapshots=True) is None
    # the earlier format held the last k + 1 snapshots
    earlier = {key: value for key, value in _state(snapshot_steps=(0, 1, 2)).items() if key not in ("format",)}
    assert _shortfall(earlier, world_size=2, keeps_snapshots=True) is None


def test_a_run_that_keeps_snapshots_resumed_from_one_that_sampled_ahead_names_its_reason():
    for world_size in (1, 2):  # snapshots are the same on every process: the number of processes is not the cause
        message = _shortfall(_state(), world_size=world_size, keeps_snapshots=True)
        assert message.startswith("kept the batches its run had sampled ahead, not the weights"), message
        assert "generation steps [3, 4]" in message and DYNAMIC_SAMPLING in message
        assert "process" not in message.split(".")[0] and "max_steps" not in message


def test_a_checkpoint_written_at_the_end_of_its_run_says_so():
    """Its run ended at step 3 (max_steps=3): it kept the weights of the step after (3, by step 1's) and sampled
    nothing ahead; a run continued to more steps lacks the weights of step 4."""
    message = _shortfall(_state(snapshot_steps=(1,), batches=()), world_size=2)
    assert message.startswith("was written at the end of its run (its max_steps)"), message
    assert "nothing past generation step 2" in message and "generation steps [4]" in message
    assert "this run has" not in message


def test_the_restart_warning_names_the_cause_at_the_resumed_steps_only():
    shortfall = "was written by 1 process and this run has 2 processes: (the cause)"

    def restarted(at_step: int, resumed_at: int = 3) -> str:
        behaviour = BehaviourWeights(max_staleness=2, keep_all=False)
        assert behaviour.load_state_dict(_state())
        _RESUMED[behaviour] = (resumed_at, shortfall)
        while behaviour.generation_steps <= at_step:
            behaviour.record({"w": torch.zeros(2)})
        with pytest.raises(LookupError) as missing:
            behaviour.weights_for(at_step + 1)
        with pytest.warns(UserWarning) as caught:
            restart_pipeline(behaviour, missing.value)
        assert behaviour not in _RESUMED and behaviour.first_step == at_step
        return str(caught[0].message)

    at_resume = restarted(3)
    assert at_resume.startswith("Asynchronous rollouts: the behaviour weights of generation step 4")
    assert f"The checkpoint this run resumed from {shortfall}." in at_resume
    assert "another generator, number of processes or dynamic-sampling setting" not in at_resume
    later = restarted(3, resumed_at=0)  # a resume long before: not its cause
    assert shortfall not in later and "after the last one train() trains" in later
