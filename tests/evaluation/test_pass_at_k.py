"""pass@k against hand-computed values and edge cases; the sampling evaluator and its callback on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset

from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k, pass_at_k


def _exact(n: int, c: int, k: int) -> float:
    """The definition, with exact integer binomials."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (10, 1, 1, 0.1),  # one correct of ten, one draw
        (10, 5, 1, 0.5),
        (4, 2, 2, 1 - 1 / 6),  # C(2,2)/C(4,2) = 1/6
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (8, 3, 4, 1 - 5 / 70),  # C(5,4)/C(8,4) = 5/70
        (20, 2, 10, 1 - 45 / 190),  # C(18,10)/C(20,10) = (10*9)/(20*19)
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(_exact(n, c, k), abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0  # c = 0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0  # c = n
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 7, 4) == 1.0  # k > n - c: every draw of 4 holds a correct one
    assert pass_at_k(10, 6, 4) < 1.0  # k = n - c: one draw of 4 misses
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


def test_pass_at_k_is_numerically_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form stays exact enough and in [0, 1].
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(_exact(1000, 3, 500), rel=1e-12)
    assert 0.0 <= pass_at_k(5000, 1, 1) <= 1.0
    assert pass_at_k(5000, 1, 1) == pytest.approx(1 / 5000)
    # pass@k grows with k and with c
    assert pass_at_k(100, 5, 1) < pass_at_k(100, 5, 10) < pass_at_k(100, 5, 50)
    assert pass_at_k(100, 1, 10) < pass_at_k(100, 5, 10)


@pytest.mark.parametrize(
    "n, c, k, message",
    [
        (0, 0, 1, "n must be >= 1"),
        (4, 5, 1, "c must be between"),
        (4, -1, 1, "c must be between"),
        (4, 1, 5, "k must"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)
    with pytest.raises(TypeError, match="k must be an int"):
        pass_at_k(4, 1, 1.0)


def test_mean_pass_at_k():
    assert mean_pass_at_k([0, 4, 2], 4, 1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert mean_pass_at_k([1, 1], [2, 4], 1) == pytest.approx((0.5 + 0.25) / 2)
    with pytest.raises(ValueError, match="empty"):
        mean_pass_at_k([], 4, 1)
    with pytest.raises(ValueError, match="sample counts"):
        mean_pass_at_k([1, 2], [4], 1)


def _always(value):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    reward.__name__ = f"always_{value}"
    return reward


def _rows(n: int = 6) -> Dataset:
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"rev {i:04d}"}], "answer": f"{i:04d}"[::-1]} for i in range(n)]
    )


def test_evaluate_pass_at_k_on_a_tiny_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from trl_reasoning.evaluation.callbacks import evaluate_pass_at_k
    from trl_reasoning.models.loading import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = load_tokenizer(tiny_model_path)
    options = dict(num_samples=4, ks=(1, 4), max_new_tokens=5, batch_size=4)
    right = evaluate_pass_at_k(model, tokenizer, _rows(), _always(1.0), **options)
    assert right["pass@1"] == right["pass@4"] == right["accuracy"] == right["reward"] == 1.0
    assert right["num_prompts"] == 6 and 1.0 <= right["mean_length"] <= 5.0
    wrong = evaluate_pass_at_k(model, tokenizer, _rows(), [_always(0.0), _always(0.5)], **options)
    assert wrong["pass@1"] == wrong["accuracy"] == 0.0 and wrong["reward"] == pytest.approx(0.5)

    # The reward sees the dataset's columns and the completions, as in TRL; a per-row pattern gives exact pass@k.
    def first_half(completions, answer, **kwargs):
        assert len(answer) == len(completions) and isinstance(completions[0], list)
        return [float(a in {"0000", "1000", "2000"}) for a in answer]

    half = evaluate_pass_at_k(model, tokenizer, _rows(), first_half, **options)
    assert half["pass@1"] == half["pass@4"] == half["accuracy"] == 0.5
    with pytest.raises(ValueError, match="between 1 and num_samples=4"):
        evaluate_pass_at_k(model, tokenizer, _rows(), first_half, num_samples=4, ks=(8,))
    with pytest.raises(ValueError, match="returned 1 values"):
        evaluate_pass_at_k(model, tokenizer, _rows(), lambda completions, **kw: [1.0], **options)


def test_the_evaluation_is_seeded_and_leaves_the_random_stream_alone(tiny_model_path):
    """The same command gives the same numbers (the main job's "before" row moved by a quarter of its gains between
    identical runs), another seed samples otherwise, and torch's global stream is as the evaluation found it."""
    from transformers import AutoModelForCausalLM

    from trl_reasoning.evaluation.callbacks import evaluate_pass_at_k
    from trl_reasoning.models.loading import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = load_tokenizer(tiny_model_path)

    def lengths(completion_ids, **kwargs):  # a reward that tells the samples apart
        return [float(len(ids) % 2) for ids in completion_ids]

    options = dict(num_samples=4, ks=(1,), max_new_tokens=6, batch_size=6, greedy=False)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = evaluate_pass_at_k(model, tokenizer, _rows(), lengths, **options)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(7)  # the global stream does not matter
    assert evaluate_pass_at_k(model, tokenizer, _rows(), lengths, **options) == first
    others = [evaluate_pass_at_k(model, tokenizer, _rows(), lengths, seed=s, **options) for s in (1, 2, 3)]
    assert any(other["mean_length"] != first["mean_length"] for other in others)


@pytest.mark.parametrize("trainer_kind", ["dapo", "trl_grpo"])
def test_pass_at_k_callback_logs_to_the_trainer(trainer_kind, tiny_model_path, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from trl_reasoning import DAPOConfig, DAPOTrainer
    from trl_reasoning.evaluation.callbacks import PassAtKCallback
    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.digit_reversal import exact_match_reward

    config_class, trainer_class = (DAPOConfig, DAPOTrainer) if trainer_kind == "dapo" else (GRPOConfig, GRPOTrainer)
    extra = {"dynamic_sampling": False} if trainer_kind == "dapo" else {}
    args = config_class(
        **cpu_config_kwargs(output_dir=str(tmp_path)),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        **extra,
    )
    trainer = trainer_class(
        model=tiny_model_path,
        reward_funcs=[_always(1.0)],
        args=args,
        train_dataset=_rows(16),
        processing_class=load_tokenizer(tiny_model_path),
    )
    callback = PassAtKCallback(trainer, _rows(4), exact_match_reward, num_samples=2, ks=(1, 2), eval_steps=1)
    trainer.add_callback(callback)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "eval_pass_at_k/pass@1" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    for entry in logged:
        assert {
            "eval_pass_at_k/pass@2",
            "eval_pass_at_k/accuracy",
            "eval_pass_at_k/reward",
            "eval_pass_at_k/mean_length",
        } <= set(entry)
        assert 0.0 <= entry["eval_pass_at_k/pass@1"] <= entry["eval_pass_at_k/pass@2"] <= 1.0
    # the trainer's own training metrics are still logged, not swallowed by the callback's log call
    assert sum("reward" in entry for entry in trainer.state.log_history) == 2
    assert trainer.model.training
