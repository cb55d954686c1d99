"""Which prompts get sampled: prompt keys, retired prompts, the epoch sampler, the prompt stream and the sampling state
a checkpoint keeps (no model)."""

from __future__ import annotations

import json

import pytest
from trl.trainer.utils import RepeatSampler

from trl_reasoning.algorithms.prompt_sampling import (
    SAMPLING_STATE_FORMAT,
    EpochRepeatSampler,
    PromptState,
    PromptStream,
    RetiredPrompts,
    eligible_indices,
    prompt_key,
)


def test_prompt_key_is_stable_and_distinguishes_prompts():
    chat = [{"role": "user", "content": "1+1="}]
    assert prompt_key(chat) == prompt_key([{"content": "1+1=", "role": "user"}])  # key order does not matter
    assert prompt_key(chat) != prompt_key([{"role": "user", "content": "1+2="}])
    assert len(prompt_key("text prompt")) == 16


def test_retired_prompts_exclude_only_later_epochs_and_round_trip():
    retired = RetiredPrompts()
    assert retired.retire("a", 0) and retired.retire("b", 1)
    assert not retired.retire("a", 2)  # keeps the first epoch
    assert retired.excluded_before(0) == set()
    assert retired.excluded_before(1) == {"a"}
    assert retired.excluded_before(2) == {"a", "b"}
    copy = RetiredPrompts()
    copy.load_state_dict(retired.state_dict())
    assert copy.epoch_of == {"a": 0, "b": 1}


def test_eligible_indices():
    keys = ["a", "b", "c"]
    assert eligible_indices(keys, {"b"}, 3) == [0, 2]
    assert eligible_indices(None, set(), 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="Prompt keys are needed"):
        eligible_indices(None, {"a"}, 3)


@pytest.mark.parametrize("shuffle", [True, False])
def test_epoch_zero_is_trls_repeat_sampler_order(shuffle):
    kwargs = dict(mini_repeat_count=3, batch_size=4, repeat_count=2, shuffle=shuffle, seed=42)
    ours = list(EpochRepeatSampler(num_samples=10, **kwargs))
    trls = list(RepeatSampler(list(range(10)), **kwargs))
    assert ours == trls
    assert len(EpochRepeatSampler(num_samples=10, **kwargs)) == len(RepeatSampler(list(range(10)), **kwargs))


def test_epoch_order_is_a_function_of_the_epoch_alone():
    sampler = EpochRepeatSampler(num_samples=12, mini_repeat_count=2, batch_size=3, seed=5)
    sampler.set_epoch(2)
    epoch_two = list(sampler)
    assert list(sampler) == epoch_two  # iterating again does not advance anything
    fresh = EpochRepeatSampler(num_samples=12, mini_repeat_count=2, batch_size=3, seed=5)
    fresh.set_epoch(2)
    assert list(fresh) == epoch_two  # a resumed run rebuilds the same order
    fresh.set_epoch(1)
    assert list(fresh) != epoch_two


def test_retired_prompts_leave_later_epochs_and_the_length_stays_fixed():
    keys = [f"k{i}" for i in range(8)]
    retired = RetiredPrompts()
    retired.retire("k3", 0)
    retired.retire("k5", 1)
    sampler = EpochRepeatSampler(
        num_samples=8, mini_repeat_count=2, batch_size=4, seed=0, retired=retired, prompt_keys=lambda: keys
    )
    for epoch, absent in ((0, set()), (1, {3}), (2, {3, 5})):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert len(order) == len(sampler) == 16
        assert absent.isdisjoint(order)
        if epoch == 0:
            assert sorted(set(order)) == list(range(8))


def test_every_prompt_retired_gives_an_empty_epoch_with_a_warning_not_an_error():
    # (The trainer stops at the end of the epoch that retired the last prompt; an empty epoch only happens when a run
    # is resumed past that point, and the Trainer ends training on an epoch without batches.)
    retired = RetiredPrompts()
    for key in ("a", "b"):
        retired.retire(key, 0)
    sampler = EpochRepeatSampler(
        num_samples=2, mini_repeat_count=2, batch_size=1, seed=0, retired=retired, prompt_keys=lambda: ["a", "b"]
    )
    assert len(list(sampler)) == 4  # epoch 0 still has both (they were retired during it)
    sampler.set_epoch(1)
    with pytest.warns(UserWarning, match="Every one of the 2 training prompts has been retired"):
        assert list(sampler) == []


def test_prompt_state_says_whether_prompts_are_left_for_an_epoch():
    state = PromptState(0, lambda: 3, lambda: ["a", "b", "c"])
    assert state.prompts_left(5)
    for key in ("a", "b"):
        state.retired.retire(key, 2)
    assert state.prompts_left(3)
    state.retired.retire("c", 3)
    assert state.prompts_left(3) and not state.prompts_left(4)


def test_sampler_rejects_a_dataset_smaller_than_a_batch():
    with pytest.raises(ValueError, match="has 3 prompts, fewer than the 4 unique prompts"):
        EpochRepeatSampler(num_samples=3, mini_repeat_count=2, batch_size=4)


def test_prompt_stream_is_seeded_covers_every_prompt_and_resumes():
    stream = PromptStream(num_samples=5, seed=3)
    first = stream.take(3) + stream.take(2)
    assert sorted(first) == [0, 1, 2, 3, 4]  # one pass is a permutation
    assert PromptStream(num_samples=5, seed=3).take(5) == first
    assert PromptStream(num_samples=5, seed=4).take(5) != first

    stream = PromptStream(num_samples=5, seed=3)
    stream.take(4)
    state = stream.state_dict()
    expected = stream.take(7)
    resumed = PromptStream(num_samples=5, seed=3)
    resumed.load_state_dict(state)
    assert resumed.take(7) == expected


def test_prompt_stream_skips_retired_prompts_from_its_next_pass():
    keys = ["a", "b", "c", "d"]
    retired = RetiredPrompts()
    stream = PromptStream(num_samples=4, seed=0, retired=retired, prompt_keys=lambda: keys)
    stream.take(4)
    retired.retire("b", 0)
    assert 1 not in stream.take(6)
    retired.retire("a", 0)
    retired.retire("c", 0)
    retired.retire("d", 0)
    stream.remaining = []
    assert not stream.has_prompts()
    with pytest.raises(RuntimeError, match="Every training prompt has been retired"):
        stream.take(1)


def test_prompt_state_round_trips_everything_a_checkpoint_keeps():
    keys = [f"p{i}" for i in range(8)]
    state = PromptState(seed=3, dataset_size=lambda: 8, prompt_keys=lambda: keys)
    sampler = state.new_sampler(num_samples=8, mini_repeat_count=2, batch_size=2, repeat_count=1, shuffle=True)
    state.retired.retire("p1", 0)
    sampler.set_epoch(2)
    taken = state.extra_prompts().take(3)
    saved = json.loads(json.dumps(state.state_dict()))  # as written to the checkpoint folder
    assert saved["sampler_epoch"] == 2 and saved["retired_prompts"] == {"epoch_of": {"p1": 0}}

    restored = PromptState(seed=3, dataset_size=lambda: 8, prompt_keys=lambda: keys)
    restored_sampler = restored.new_sampler(
        num_samples=8, mini_repeat_count=2, batch_size=2, repeat_count=1, shuffle=True
    )
    restored.load_state_dict(saved)
    assert restored_sampler.epoch == 2 and list(restored_sampler) == list(sampler)
    assert (
        restored.extra_prompts().take(5) == state.extra_prompts().take(5) and 1 not in taken + state.stream.remaining
    )


def test_a_restored_stream_from_another_dataset_restarts_instead_of_indexing_past_it():
    saved = PromptState(0, lambda: 8, lambda: [str(i) for i in range(8)])
    saved.extra_prompts().take(3)
    state = saved.state_dict()
    assert state["num_samples"] == 8 and state["format"] == 1
    # same dataset: the stream resumes where it was
    same = PromptState(0, lambda: 8, lambda: [str(i) for i in range(8)])
    assert same.load_state_dict(state) == []
    assert same.extra_prompts().take(5) == saved.extra_prompts().take(5)
    # a smaller dataset: a note, and a new pass over the new dataset whose indices are all in range
    smaller = PromptState(0, lambda: 4, lambda: [str(i) for i in range(4)])
    notes = smaller.load_state_dict(state)
    assert len(notes) == 1 and "4 prompts" in notes[0] and "8 prompts" in notes[0]
    assert all(0 <= index < 4 for index in smaller.extra_prompts().take(10))
    # a file without num_samples (written before it was recorded) whose indices are out of range: the same
    legacy = {key: value for key, value in state.items() if key != "num_samples"}
    assert PromptState(0, lambda: 2, lambda: ["0", "1"]).load_state_dict(legacy)


def test_the_state_is_written_with_its_format_constant():
    assert PromptState(0, lambda: 2, lambda: ["0", "1"]).state_dict()["format"] == SAMPLING_STATE_FORMAT == 1
