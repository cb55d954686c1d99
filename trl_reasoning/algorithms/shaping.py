"""Reward shaping on a gathered batch: the combined and task rewards (TRL's two multi-objective
aggregations), reward clipping, the binary-reward check, RLOO's KL-in-reward. Pure tensors; the DAPO overlong penalty
itself is :func:`trl_reasoning.rewards.wrapping.overlong_penalty`.

``rewards_per_func`` is ``(N, n_funcs)``, gathered over processes, ``NaN`` where a function returned ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..rewards.wrapping import RewardFunctionError, non_binary_reward_functions
from .advantages import nan_std

#: TRL's ``multi_objective_aggregation`` values: how several reward functions make one reward per completion.
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def combined_rewards(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, columns: torch.Tensor | None = None
) -> torch.Tensor:
    """``(N,)`` weighted sum of the reward functions (of those in ``columns``, one bool per function, when given):
    TRL's ``multi_objective_aggregation="sum_then_normalize"``. ``NaN`` where none of them scored the completion.

    With ``columns`` = the task reward functions this is the *task reward* (``docs/algorithms.md``, "Task
    reward") that dynamic sampling, zero-variance filtering and no-positive-resampling judge."""
    weights = weights.to(rewards_per_func.device)
    if columns is not None:
        columns = columns.to(rewards_per_func.device)
        rewards_per_func, weights = rewards_per_func[:, columns], weights[columns]
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def normalize_then_sum_rewards(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, epsilon: float = 1e-4
) -> torch.Tensor:
    """``(N,)`` TRL's ``multi_objective_aggregation="normalize_then_sum"`` before its final batch standardisation:
    each reward function's outputs are standardised within each group, ``z_ik = (r_ik - mean_g,k) / (std_g,k +
    eps)`` (``NaN`` ignored; ``std`` with Bessel's correction, ``0`` when ``num_generations == 1``), then summed with
    the reward weights, ``r_i = sum_k w_k z_ik`` (a function that scored nothing in a group adds nothing). ``NaN``
    where no function scored the completion. A function's scale then no longer decides its share of the advantage.
    Source: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (GDPO, decoupled group normalisation)."""
    count = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, num_generations, count)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nan_std(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    standardized = ((grouped - mean) / (std + epsilon)).view(-1, count)
    rewards = (standardized * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def clip_rewards(rewards: torch.Tensor, clip_range: Sequence[float] | None) -> torch.Tensor:
    """``rewards`` clamped to ``clip_range = (low, high)`` (unchanged when ``None``; ``NaN`` stays ``NaN``): TRL
    ``RLOOConfig.reward_clip_range``, applied to the weighted sum before the KL penalty."""
    if not clip_range:
        return rewards
    low, high = clip_range
    return rewards.clamp(min=low, max=high)


def check_binary_rewards(
    rewards_per_func: torch.Tensor,
    combined: torch.Tensor,
    names: Sequence[str],
    weights: torch.Tensor,
    estimator: str,
) -> None:
    """Raise :class:`RewardFunctionError`, naming the function, when an estimator that needs 0/1 rewards (MaxRL's)
    gets another value from a reward function or from their weighted sum."""
    offenders = non_binary_reward_functions(rewards_per_func, names)
    if offenders:
        raise RewardFunctionError(
            f"advantage_estimator={estimator!r} needs binary rewards (0 or 1), but "
            + "; ".join(f"reward function '{name}' returned {value}" for name, value in offenders)
            + ". Set maxrl_reward_threshold to binarize them (reward >= threshold counts as a success)."
        )
    scored = combined[~torch.isnan(combined)]
    if not bool(((scored == 0) | (scored == 1)).all()):
        raise RewardFunctionError(
            f"advantage_estimator={estimator!r} needs binary rewards, but the weighted sum of the reward functions "
            f"({', '.join(names)}; reward_weights={weights.tolist()}) is not 0 or 1. Use one binary reward function, "
            "or set maxrl_reward_threshold."
        )


def sequence_kl(old_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` the k1 estimate of KL(policy || reference) of each completion, summed over its tokens, without
    gradient: ``sum_t m_t (log pi_old - log pi_ref)`` (TRL's RLOOTrainer; RLOO folds ``beta`` times it into the
    reward)."""
    return ((old_logps.detach() - ref_logps.detach()) * mask).sum(dim=1)


#: OpenRLHF's bound on the log-ratio of its KL estimates (``compute_approx_kl``: ``clamp(min=-10, max=10)``).
TOKEN_KL_BOUND = 10.0


def token_kl(old_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` the k1 estimate of KL(policy || reference) at each completion token, without gradient:
    ``clamp(log π_old − log π_ref, −10, 10)`` where ``mask`` is 1, ``0`` elsewhere (REINFORCE++'s per-token penalty,
    which :func:`trl_reasoning.algorithms.advantages.reinforce_pp_returns` scales by ``β`` and sums to the end).

    Source: REINFORCE++ (Hu et al., arXiv 2501.03262), the k1 KL between ``π_old`` (the policy the batch was scored
    with) and the reference; OpenRLHF ``openrlhf/models/utils.py`` ``compute_approx_kl`` (``kl_estimator="k1"``, the log-ratio clamped to
    ``[-10, 10]``). Unlike :func:`sequence_kl` (RLOO's, unclamped, as TRL's ``RLOOTrainer``) it stays per token."""
    log_ratio = (old_logps.detach() - ref_logps.detach()).clamp(min=-TOKEN_KL_BOUND, max=TOKEN_KL_BOUND)
    return torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
