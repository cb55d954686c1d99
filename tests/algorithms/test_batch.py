"""Floor 0, the batch: advantages and loss weights of a gathered batch with inactive groups, and row regrouping.
Model-free: these are the decisions the seam makes on every step, checked on tensors alone."""

from __future__ import annotations

import pytest
import torch

from trl_reasoning.algorithms.advantages import compute_advantages
from trl_reasoning.algorithms.aggregation import completion_weights
from trl_reasoning.algorithms.batch import batch_advantages_and_weights, stack_rows


@pytest.mark.parametrize("estimator", ["grpo", "scalerl", "batch", "dr_grpo", "rloo"])
@pytest.mark.parametrize(
    "aggregation", ["token_mean", "prompt_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_inactive_groups_are_invisible_to_the_estimator_and_the_normaliser(estimator, aggregation):
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=generator, dtype=torch.float64)
    tokens = torch.randint(1, 9, (12,), generator=generator).double()
    active = torch.tensor([True, False, True])
    advantages, weights, rows = batch_advantages_and_weights(rewards, tokens, 4, estimator, aggregation, 8, active)
    kept = torch.tensor([True] * 4 + [False] * 4 + [True] * 4)
    assert torch.equal(rows, kept)
    # Equal to running on the active groups alone (the dropped group changes neither the std nor the token count).
    torch.testing.assert_close(advantages[kept], compute_advantages(rewards[kept], 4, estimator))
    torch.testing.assert_close(weights[kept], completion_weights(tokens[kept], aggregation, 4, 8))
    assert advantages[~kept].eq(0).all() and weights[~kept].eq(0).all()


def test_every_group_is_active_without_a_selection():
    rewards, tokens = torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([2.0, 3.0, 4.0, 5.0])
    advantages, weights, rows = batch_advantages_and_weights(rewards, tokens, 2, "dr_grpo", "token_mean", 8)
    assert rows is None
    assert advantages.tolist() == [-0.5, 0.5, 0.0, 0.0]
    torch.testing.assert_close(weights, torch.full((4,), 1 / 14))


def test_no_active_group_trains_nothing_and_options_reach_the_estimator():
    rewards = torch.tensor([0.2, 0.9, 0.1, 0.7])
    none_active = batch_advantages_and_weights(
        rewards, torch.ones(4), 2, "grpo", "token_mean", 8, torch.tensor([False, False])
    )
    assert none_active[0].eq(0).all() and none_active[1].eq(0).all()
    maxrl, _, _ = batch_advantages_and_weights(
        rewards, torch.ones(4), 2, "maxrl", "token_mean", 8, reward_threshold=0.5
    )
    assert maxrl.tolist() == [-1.0, 1.0, -1.0, 1.0]


def test_a_selection_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="active_groups has 3 groups of 2, but the batch has 4 completions"):
        batch_advantages_and_weights(torch.zeros(4), torch.ones(4), 2, "grpo", "token_mean", 8, torch.ones(3) > 0)


def test_stack_rows_pads_prompts_left_and_completions_right():
    first = {
        "prompt_ids": torch.tensor([[7, 8], [0, 9]]),
        "completion_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "rollout_topk_ids": torch.arange(12).view(2, 3, 2),
        "advantages": torch.tensor([0.5, -0.5]),
    }
    second = {
        "prompt_ids": torch.tensor([[5, 6, 7]]),
        "completion_ids": torch.tensor([[9]]),
        "completion_mask": torch.tensor([[1]]),
        "rollout_topk_ids": torch.tensor([[[9, 9]]]),
        "advantages": torch.tensor([1.0]),
    }
    stacked = stack_rows([first, second], [(1, 0), (0, 1)], pad_token_id=0)
    assert stacked["prompt_ids"].tolist() == [[5, 6, 7], [0, 0, 9]]  # left-padded to 3
    assert stacked["completion_ids"].tolist() == [[9, 0, 0], [4, 5, 0]]  # right-padded to 3
    assert stacked["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]
    assert stacked["rollout_topk_ids"].tolist() == [[[9, 9], [0, 0], [0, 0]], [[6, 7], [8, 9], [10, 11]]]
    assert stacked["advantages"].tolist() == [1.0, -0.5]


def test_spanning_token_type_ids_pad_by_part_with_zero():
    from trl_reasoning.algorithms.batch import join_spanning, left_padded, pad_value, split_spanning

    # Two rounds with prompt widths 3 and 2: the prompt part is left-padded, the completion part right-padded, with 0
    # (token-type ids are not token ids: padding them with the pad token would mark padding as an image).
    first = {"prompt_ids": torch.tensor([[5, 6, 7]]), "mm_token_type_ids": torch.tensor([[0, 1, 0, 0, 0]])}
    second = {"prompt_ids": torch.tensor([[8, 9]]), "mm_token_type_ids": torch.tensor([[1, 0, 0, 0, 0, 0]])}
    rounds = [split_spanning(first, 3), split_spanning(second, 2)]
    stacked = join_spanning(stack_rows(rounds, [(0, 0), (1, 0)], pad_token_id=97))
    assert stacked["mm_token_type_ids"].tolist() == [[0, 1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]]
    assert stacked["prompt_ids"].tolist() == [[5, 6, 7], [97, 8, 9]]
    assert pad_value("prompt_part:mm_token_type_ids", 97) == 0 and left_padded("prompt_part:mm_token_type_ids")
    assert not left_padded("completion_part:token_type_ids")
