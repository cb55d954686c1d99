"""The evidence testbed's chain-sum task: splits, the teacher, the reward (the bench itself: test_bench_quick)."""

from __future__ import annotations

import pytest

from trl_reasoning.models.tiny import build_tokenizer
from trl_reasoning.tasks.chain_sums import ChainSumTask, chain_sum_answer, chain_sum_reward


def test_splits_are_disjoint_balanced_and_seeded():
    task = ChainSumTask(num_train=500, num_test_per_length=10)
    train, test = task.splits()
    assert len(train) == 500 and len(test) == 10 * (task.max_terms - task.min_terms + 1)
    assert not set(train) & set(test)
    assert {len(t) for t in test} == set(range(task.min_terms, task.max_terms + 1))
    assert all(1 <= term <= 9 for terms in train + test for term in terms)
    assert task.splits() == (train, test)
    assert ChainSumTask(num_train=500, num_test_per_length=10, seed=1).splits() != (train, test)


def test_rows_carry_the_answer_and_the_chain_length():
    row = ChainSumTask(num_train=5, num_test_per_length=3).rl_rows("test")[0]
    terms = [int(t) for t in row["prompt"][0]["content"].split()[1:]]
    assert row["answer"] == str(sum(terms)) and row["num_terms"] == len(terms)
    with pytest.raises(ValueError, match="split must be"):
        ChainSumTask().rl_rows("validation")


def test_the_scratchpad_writes_running_sums():
    assert ChainSumTask.scratchpad((3, 5, 8, 2)) == "8 16 18=18"
    assert ChainSumTask.question((3, 5)) == "sum 3 5"


def test_the_teacher_skips_and_slips_at_its_rates():
    task = ChainSumTask(num_train=4000, skip_rate=0.4, slip_rate=0.12)
    rows = task.warm_start_rows(build_tokenizer())
    train, _ = task.splits()
    skipped = [r for r in rows if r["completion"].startswith("=")]
    assert abs(len(skipped) / len(rows) - 0.4) < 0.03
    assert all(r["prompt"].endswith("a:") for r in rows)  # the chat template's generation prompt
    worked = [(terms, r["completion"]) for terms, r in zip(train, rows) if not r["completion"].startswith("=")]
    for length in (2, 8):
        chains = [(t, c) for t, c in worked if len(t) == length]
        clean = sum(c == ChainSumTask.scratchpad(t) for t, c in chains) / len(chains)
        assert abs(clean - 0.88 ** (length - 1)) < 0.08, (length, clean)


def test_the_reward_reads_only_the_number_after_the_last_equals_sign():
    completions = [
        "8 16 18=18",
        "=18",
        "8 16 19=19",
        "18",
        "=18 and more",
        [{"role": "assistant", "content": " =18 "}],
    ]
    assert chain_sum_reward(completions, ["18"] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert chain_sum_answer("1 2=3=4") == "4" and chain_sum_answer("no answer") is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"min_terms": 1}, "min_terms"),
        ({"min_terms": 5, "max_terms": 4}, "max_terms"),
        ({"num_train": 0}, "num_train"),
        ({"num_test_per_length": 50}, "num_test_per_length"),
        ({"skip_rate": 1.0}, "skip_rate"),
        ({"slip_rate": -0.1}, "slip_rate"),
    ],
)
def test_invalid_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ChainSumTask(**kwargs)
