"""The pure sampling pieces: informative groups, pass rates, group selection, the epoch sampler and the prompt
stream (no model)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from trl.trainer.utils import RepeatSampler

from trl_reasoning.algorithms.group_selection import (
    GROUP_SELECTIONS,
    EpochRepeatSampler,
    GroupSelection,
    PromptState,
    PromptStream,
    RetiredPrompts,
    SampledRound,
    eligible_indices,
    extra_round_groups,
    group_pass_rates,
    group_selection_name,
    informative_groups,
    is_correctness_reward,
    prompt_key,
    sample_groups,
    select_groups,
)

nan = math.nan


def test_informative_groups_by_hand():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, nan, 1.0, 1.0, nan, nan, nan, 0.5, nan])
    # groups of 4: [1,1,1,0] mixed; [0,0,0,1] mixed; [nan,1,1,nan] equal among scored; [nan,nan,0.5,nan] one scored
    assert informative_groups(rewards, 4).tolist() == [True, True, False, False]


def test_informative_groups_all_equal_and_all_nan():
    assert informative_groups(torch.zeros(6), 3).tolist() == [False, False]
    assert informative_groups(torch.full((4,), nan), 2).tolist() == [False, False]
    assert informative_groups(torch.tensor([0.2, 0.2 + 1e-6]), 2).tolist() == [True]


def test_informative_groups_rejects_a_ragged_batch():
    with pytest.raises(ValueError, match=r"multiple of num_generations \(4\)"):
        informative_groups(torch.zeros(6), 4)


def test_group_pass_rates_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, -1.0, -1.0, 1.0, nan, nan, nan, nan, nan])
    rates = group_pass_rates(rewards, 4)
    assert rates[0].item() == pytest.approx(0.75)
    assert rates[1].item() == pytest.approx(1 / 3)  # the NaN is not counted
    assert math.isnan(rates[2].item())


def test_select_groups_takes_the_first_informative_then_fillers():
    assert select_groups([False, True, True, False, True], 2) == ([1, 2], [True, True])
    assert select_groups([False, True, False, False], 3) == ([1, 0, 2], [True, False, False])
    assert select_groups([False, False], 2) == ([0, 1], [False, False])
    with pytest.raises(ValueError, match="Cannot fill 3 groups from 2 candidates"):
        select_groups([True, False], 3)


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


# ---------------------------------------------------------------------------------------------------- group selection


def _rounds(*flags_per_round, num_generations=2):
    """score_round for sample_groups: round i has the informative flags flags_per_round[i] (rewards 0 1 or 1 1)."""
    calls = []

    def score_round(index, num_groups):
        calls.append(index)
        flags = torch.tensor(flags_per_round[index])
        rewards = torch.stack([torch.tensor([0.0, 1.0]) if f else torch.tensor([1.0, 1.0]) for f in flags]).flatten()
        return SampledRound(rows=f"round {index}", rewards=rewards, informative=flags)

    return score_round, calls


def test_all_groups_train_from_one_round():
    score_round, calls = _rounds([True, False, True], [True, True, True])
    plan = sample_groups("all", score_round, target=3, max_rounds=5)
    assert calls == [0] and plan.chosen == [0, 1, 2] and plan.active is None
    assert not plan.regroup and not plan.cap_hit


def test_zero_variance_filtering_drops_without_generating_more():
    score_round, calls = _rounds([True, False, True], [True, True, True])
    plan = sample_groups("zero_variance", score_round, target=3, max_rounds=5)
    assert calls == [0] and plan.active.tolist() == [True, False, True] and not plan.regroup


def test_dynamic_sampling_generates_until_the_batch_is_full_then_keeps_exactly_the_target():
    score_round, calls = _rounds([True, False, False], [False, True, False], [True, True, True], [True, True, True])
    plan = sample_groups("dynamic", score_round, target=3, max_rounds=5)
    assert calls == [0, 1, 2]  # 1 + 1 + 3 informative groups: enough after the third round
    assert plan.chosen == [0, 4, 6] and plan.active.tolist() == [True, True, True] and not plan.cap_hit
    # Group 4 is the second group of round 1, group 6 the first of round 2: rows (round, row) for the batch.
    assert plan.row_sources(2) == [(0, 0), (0, 1), (1, 2), (1, 3), (2, 0), (2, 1)]


def test_dynamic_sampling_out_of_rounds_fills_with_inactive_groups():
    score_round, calls = _rounds([False, True, False], [False, False, False])
    plan = sample_groups("dynamic", score_round, target=3, max_rounds=2)
    assert calls == [0, 1] and plan.cap_hit
    assert plan.chosen == [1, 0, 2] and plan.active.tolist() == [True, False, False]


def test_extra_rounds_are_sized_by_the_callback_the_first_is_a_full_batch():
    sizes = []
    flags = [[True, False, False, False], [False, True], [True, True]]

    def score_round(index, num_groups):
        sizes.append(num_groups)
        informative = torch.tensor(flags[index])
        return SampledRound(rows=None, rewards=torch.zeros(2 * informative.numel()), informative=informative)

    plan = sample_groups("dynamic", score_round, target=4, max_rounds=5, next_round_groups=lambda rounds: 2)
    assert sizes == [4, 2, 2] and plan.chosen == [0, 5, 6, 7]
    assert plan.row_sources(2)[2:4] == [(1, 2), (1, 3)]  # group 5 is the second group of the 2-group round 1


@pytest.mark.parametrize(
    "kept, generated, target, processes, generations, expected",
    [
        (6, 8, 8, 1, 4, 3),  # 2 missing at a keep rate of 3/4: ceil(2 * 8 / 6) = 3
        (3, 8, 8, 1, 4, 8),  # ceil(5 * 8 / 3) = 14, capped at a full batch of 8
        (6, 8, 8, 2, 4, 3),  # 3 groups = 12 rows: 6 per process
        (6, 8, 8, 4, 2, 4),  # 3 groups = 6 rows cannot be split over 4 processes: 4 groups (2 rows each)
        (6, 9, 9, 3, 4, 6),  # ceil(3 * 9 / 6) = 5 groups = 20 rows, not a multiple of 3 processes: 6 groups
        (0, 8, 8, 2, 4, 8),  # nothing kept yet: no rate to go by, a full batch
        (8, 8, 8, 1, 4, 0),  # nothing missing
    ],
)
def test_extra_round_size_from_the_keep_rate(kept, generated, target, processes, generations, expected):
    assert extra_round_groups(kept, generated, target, target, processes, generations) == expected


def test_extra_round_size_always_splits_evenly_and_covers_the_expected_need():
    rng = random.Random(0)
    for _ in range(2000):
        processes, generations = rng.randint(1, 8), rng.randint(1, 16)
        full = processes * rng.randint(1, 8)  # a full batch: whole rows on every process
        target, generated = full, full + rng.randint(0, 3 * full)
        kept = rng.randint(0, target)
        groups = extra_round_groups(kept, generated, target, full, processes, generations)
        assert 0 <= groups <= full and (groups * generations) % processes == 0
        if 0 < kept < target:
            assert groups == full or groups * kept / generated >= target - kept


def test_a_new_strategy_is_one_class_and_one_registry_line():
    @GROUP_SELECTIONS.register("first_informative_round")
    class FirstInformativeRound(GroupSelection):  # regenerate until a round has any informative group, train it all
        regroup = True

        def rounds(self, limit):
            return limit

        def enough(self, rounds, target):
            return bool(rounds[-1].informative.any())

        def select(self, informative, target):
            return list(range(informative.numel() - target, informative.numel())), None

    try:
        score_round, calls = _rounds([False, False], [False, True], [True, True])
        plan = sample_groups("first_informative_round", score_round, target=2, max_rounds=3)
        assert calls == [0, 1] and plan.chosen == [2, 3] and plan.row_sources(2)[0] == (1, 0)
    finally:
        GROUP_SELECTIONS.unregister("first_informative_round")
    assert "first_informative_round" not in GROUP_SELECTIONS


def test_the_config_switches_name_the_strategy():
    assert group_selection_name(False, False) == "all"
    assert group_selection_name(False, True) == "zero_variance"
    assert group_selection_name(True, False) == group_selection_name(True, True) == "dynamic"
    with pytest.raises(ValueError, match="Unknown group selection 'replace'. Allowed values: all, zero_variance"):
        sample_groups("replace", _rounds([True])[0], target=1, max_rounds=1)


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


# ------------------------------------------------------------------------------------- pass definition, changed datasets


def test_pass_rates_with_a_threshold_of_their_own():
    rewards = torch.tensor([0.2, 0.9, 1.0, 0.95, float("nan"), 0.1, 0.0, 0.4])
    # without a threshold a pass is > 0: group 1 passes 4/4, group 2 passes 2/3 (one NaN)
    assert group_pass_rates(rewards, 4).tolist() == pytest.approx([1.0, 2 / 3])
    # with task_pass_threshold = 0.9: group 1 has 3 of 4 >= 0.9, group 2 none
    assert group_pass_rates(rewards, 4, threshold=0.9).tolist() == pytest.approx([0.75, 0.0])


@pytest.mark.parametrize(
    ("values", "expected"),
    [([0, 1, 1, 0], True), ([-1, 1, float("nan")], True), ([-1, 0, 1], True), ([0.5, 1], False), ([2, 0], False)],
)
def test_a_correctness_reward_is_one_with_values_in_minus_one_zero_one(values, expected):
    assert is_correctness_reward(torch.tensor(values, dtype=torch.float32)) is expected


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


def test_sample_groups_stops_when_the_sizer_has_no_prompts_left():
    score_round, calls = _rounds([False, False], [True, True])
    plan = sample_groups("dynamic", score_round, target=2, max_rounds=5, next_round_groups=lambda rounds: 0)
    assert calls == [0] and plan.cap_hit and len(plan.chosen) == 2 and not plan.active.any()
