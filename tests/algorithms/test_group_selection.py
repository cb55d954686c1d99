"""Which groups train: informative groups, pass rates and the group-selection strategies (no model). The samplers
and the prompt stream are tests/algorithms/test_prompt_sampling.py."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trl_reasoning.algorithms.group_selection import (
    GROUP_SELECTIONS,
    GroupSelection,
    SampledRound,
    extra_round_groups,
    group_pass_rates,
    group_selection_name,
    informative_groups,
    is_correctness_reward,
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


# ---------------------------------------------------------------------------------------------------- pass definition


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


def test_sample_groups_stops_when_the_sizer_has_no_prompts_left():
    score_round, calls = _rounds([False, False], [True, True])
    plan = sample_groups("dynamic", score_round, target=2, max_rounds=5, next_round_groups=lambda rounds: 0)
    assert calls == [0] and plan.cap_hit and len(plan.chosen) == 2 and not plan.active.any()
