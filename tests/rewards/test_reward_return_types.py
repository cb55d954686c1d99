"""Whatever a reward function may return to TRL's `GRPOTrainer`, it may return to ours: every form trains, and the
rewards the batch trains on are the ones TRL computes from it (`None` -> NaN, each value as a float32)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import cpu_args, digit_fraction, make_prompts
from transformers import TrainerCallback

import trl_reasoning as tr


def _score_head(values: list) -> torch.Tensor:
    """A reward model's score head: ``(n, 1)`` logits, still attached to the graph (no ``torch.no_grad``)."""
    head = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        head.weight.fill_(1.0)
    return head(torch.tensor(values, dtype=torch.float32)[:, None])


#: Every form of return TRL 1.16's `_calculate_rewards` takes (`[nan if r is None else r for r in output]`, then
#: `torch.tensor(..., dtype=float32)` into one column), as (build it from the values, whether it can hold None).
FORMS = {
    "list_with_none": (list, True),
    "tuple": (tuple, False),
    "generator": (lambda values: (value for value in values), True),
    "tensor_1d": (torch.tensor, False),
    "tensor_n_by_1": (lambda values: torch.tensor(values)[:, None], False),
    "score_head_n_by_1_with_grad": (_score_head, False),
    "tensor_n_by_1_by_1": (lambda values: torch.tensor(values)[:, None, None], False),
    "bool_tensor": (lambda values: torch.tensor(values) > 0.5, False),
    "numpy_float32": (lambda values: np.array(values, dtype=np.float32), False),
    "numpy_object_with_none": (lambda values: np.array(values, dtype=object), True),
    "numpy_scalars": (lambda values: [np.float64(value) for value in values], False),
    "list_of_0d_tensors": (lambda values: [torch.tensor(value) for value in values], False),
    "list_of_1_element_tensors_with_none": (
        lambda values: [None if value is None else torch.tensor([value]) for value in values],
        True,
    ),
    "async_tensor_n_by_1": (lambda values: torch.tensor(values)[:, None], False),
}


class _Rewards(TrainerCallback):
    """The rewards each step trained on (``ReasoningTrainer.last_train_batch``)."""

    def __init__(self, trainer: tr.ReasoningTrainer):
        self.trainer = trainer
        self.steps: list[torch.Tensor] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self.trainer.last_train_batch.rewards.clone())


def _values(completions, with_none: bool) -> list:
    """The digit fraction of each completion; with ``with_none``, every fourth completion is not scorable."""
    scores = digit_fraction(completions)
    return [None if with_none and i % 4 == 3 else score for i, score in enumerate(scores)]


@pytest.mark.parametrize("form", list(FORMS))
def test_every_reward_return_trl_accepts_trains_with_trls_rewards(tiny_model_path, tmp_path, form):
    build, with_none = FORMS[form]
    returned: list[list] = []

    def shaped_reward(completions, **kwargs):
        values = _values(completions, with_none)
        returned.append(values)
        return build(values)

    async def async_shaped_reward(completions, **kwargs):
        return shaped_reward(completions, **kwargs)

    reward = async_shaped_reward if form.startswith("async_") else shaped_reward
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), max_steps=2))
    trainer = tr.ReasoningTrainer(model=tiny_model_path, reward_funcs=reward, args=args, train_dataset=make_prompts())
    rewards = _Rewards(trainer)
    trainer.add_callback(rewards)
    trainer.train()

    assert trainer.state.global_step == 2 and len(returned) == 2
    for values, trained in zip(returned, rewards.steps, strict=True):
        # what GRPOTrainer makes of the returned values: None -> NaN, each value a float32 (a bool one 0 or 1)
        expected = torch.tensor(
            [math.nan if v is None else float(v > 0.5) if form == "bool_tensor" else v for v in values],
            dtype=torch.float32,
        )
        torch.testing.assert_close(trained.float().cpu(), expected, equal_nan=True)
    assert not with_none or any(torch.isnan(step).any() for step in rewards.steps)
