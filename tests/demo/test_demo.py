"""The README's main job in a fast mode: warm start, RL, before/after table, curves, model card, cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trl_reasoning.demo.__main__ import main
from trl_reasoning.demo.warm_start import WarmStartSettings, cache_key
from trl_reasoning.tasks.digit_reversal import ReversalTask, exact_match_reward


def test_reversal_task_is_seeded_with_a_disjoint_held_out_split():
    task = ReversalTask(num_train=500, num_test=50)
    train, test = task.splits()
    assert len(train) == 500 and len(test) == 50 and not set(train) & set(test)
    assert task.splits() == ReversalTask(num_train=500, num_test=50).splits()
    assert task.splits() != ReversalTask(num_train=500, num_test=50, seed=1).splits()
    row = task.rl_rows("test")[0]
    assert row["prompt"] == [{"role": "user", "content": f"rev {test[0]}"}] and row["answer"] == test[0][::-1]
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        task.rl_rows("validation")
    with pytest.raises(ValueError, match="exceeds the 100 distinct 2-digit strings"):
        ReversalTask(num_digits=2, num_train=90, num_test=20)
    with pytest.raises(ValueError, match="teacher_error_rate"):
        ReversalTask(teacher_error_rate=1.0)


def test_sloppy_teacher_and_reward():
    from trl_reasoning.models.tiny import build_tokenizer

    task = ReversalTask(num_train=2000, num_test=10, teacher_error_rate=0.6)
    rows = task.warm_start_rows(build_tokenizer())
    copied = sum(row["completion"] == row["prompt"].split("rev ")[1][:4] for row in rows) / len(rows)
    assert 0.55 < copied < 0.65 and rows[0]["prompt"].endswith("a:")
    completions = [[{"role": "assistant", "content": text}] for text in ("4321", " 4321\n", "1234", "")]
    assert exact_match_reward(completions, answer=["4321"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert exact_match_reward(["4321"], answer=["4321"]) == [1.0]


def test_cache_key_depends_on_task_and_settings():
    base = cache_key(ReversalTask(), WarmStartSettings())
    assert base == cache_key(ReversalTask(), WarmStartSettings())
    assert base != cache_key(ReversalTask(seed=1), WarmStartSettings())
    assert base != cache_key(ReversalTask(), WarmStartSettings(max_steps=10))


@pytest.mark.slow
def test_demo_runs_end_to_end_and_caches_the_warm_start(tmp_path, capsys):
    cache = tmp_path / "cache"
    common = ["--fast", "--cache_dir", str(cache), "--num_train", "128", "--warm_start_steps", "10"]
    first = main([*common, "--output_dir", str(tmp_path / "dapo")])
    out = capsys.readouterr().out
    assert "| model | held-out accuracy (greedy) | pass@1 | pass@4 | mean completion length (tokens) |" in out
    assert "| warm start (SFT) |" in out and "| after DAPO |" in out and "warm start: trained" in out
    assert first["warm_start_cached"] is False
    for phase in ("before", "after"):
        metrics = first[phase]
        assert {"accuracy", "pass@1", "pass@4", "mean_length", "reward"} <= set(metrics)
        assert 0.0 <= metrics["pass@1"] <= metrics["pass@4"] <= 1.0 and metrics["num_prompts"] == 8
    folder = Path(first["output_dir"])
    assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
    assert (folder / "curves.png").stat().st_size > 1000
    card = (folder / "README.md").read_text()
    assert "Trained with **DAPO**" in card and "trl-reasoning-demo" in card and "@article{yu2025dapo," in card
    saved = json.loads((folder / "demo_results.json").read_text())
    assert saved["after"] == first["after"] and [e["step"] for e in saved["evaluations"]] == [0, 1, 2, 2]

    # a second run, with another algorithm, reuses the cached warm start
    second = main([*common, "--algorithm", "maxrl", "--output_dir", str(tmp_path / "maxrl"), "--eval_every", "0"])
    assert second["warm_start_cached"] is True and "warm start: cached" in capsys.readouterr().out
    assert "Trained with **MaxRL**" in (tmp_path / "maxrl" / "README.md").read_text()
