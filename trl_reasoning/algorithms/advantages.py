"""Advantage estimators: one reward per completion in, one advantage per completion out.

Layout follows TRL: a batch of ``N = P * G`` completions where the ``G`` completions of a prompt are consecutive,
so ``rewards.view(P, G)`` groups them. A ``NaN`` reward marks an *unscorable* completion (every reward function
returned ``None``, TRL's convention): it is left out of its group's statistics and gets advantage ``0``.

The estimators are computed once, on the whole gathered batch (all processes), never on a micro-batch.
Formulas and sources: ``docs/algorithms.md`` ("Advantage estimators").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .registry import Registry, VariantField, at_least

AdvantageEstimator = Callable[..., torch.Tensor]
#: Traits: ``group_relative`` (the baseline is a statistic of the prompt's own group, so ``num_generations >= 2``),
#: ``trl_scale_rewards`` (TRL's ``scale_rewards`` value that means this estimator's scaling), ``binary_rewards`` (the
#: rewards must be 0/1 unless the estimator's ``reward_threshold`` binarizes them).
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def nan_std(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Standard deviation with Bessel's correction that ignores ``NaN`` entries (``NaN`` with fewer than 2 values).

    Equals ``torch.std`` on inputs without ``NaN``; equals TRL's ``nanstd``.
    """
    valid = ~torch.isnan(x)
    count = valid.sum(dim=dim, keepdim=True)
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    squared = torch.where(valid, (x - mean) ** 2, torch.zeros_like(x)).sum(dim=dim, keepdim=True)
    var = squared / (count - 1).clamp(min=1)
    var = torch.where(count > 1, var, torch.full_like(var, float("nan")))
    std = var.sqrt()
    if keepdim:
        return std
    return std.reshape(()) if dim is None else std.squeeze(dim)


def grouped_rewards(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``rewards`` ``(N,)`` as ``(N / G, G)``, one row per group; a clear error for any other shape."""
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor of one reward per completion, got shape {tuple(rewards.shape)}"
        )
    if num_generations < 1 or rewards.numel() % num_generations != 0:
        raise ValueError(
            f"The number of rewards ({rewards.numel()}) must be a multiple of num_generations ({num_generations})."
        )
    return rewards.view(-1, num_generations)


@ADVANTAGE_ESTIMATORS.register("grpo", group_relative=True, trl_scale_rewards="group")
def grpo_advantages(rewards: torch.Tensor, num_generations: int, epsilon: float = 1e-4) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)``, ``std_g`` with Bessel's correction.

    Source: DeepSeekMath, arXiv 2402.03300 (outcome supervision, Sec. 4.1.2).
    """
    grouped = grouped_rewards(rewards, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nan_std(grouped, dim=1, keepdim=True)
    # A group with a single scorable completion has no spread: its centred reward is 0 anyway.
    std = torch.nan_to_num(std, nan=0.0)
    return ((grouped - mean) / (std + epsilon)).view(-1)


@ADVANTAGE_ESTIMATORS.register("dr_grpo", group_relative=True, trl_scale_rewards="none")
def dr_grpo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Dr. GRPO: ``A_i = r_i - mean_g`` (no division by the group's std, which biases toward easy/hard prompts).

    Source: Understanding R1-Zero-Like Training, arXiv 2503.20783 (Sec. 3.1).
    """
    grouped = grouped_rewards(rewards, num_generations)
    return (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).view(-1)


@ADVANTAGE_ESTIMATORS.register("rloo", group_relative=True, trl_scale_rewards="none")
def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """REINFORCE leave-one-out: ``A_i = r_i - (sum_{j != i} r_j) / (G - 1)``, i.e. ``G/(G-1) * (r_i - mean_g)``.

    The baseline averages the scorable siblings only (as TRL's ``RLOOTrainer``); a completion without a scorable
    sibling gets ``NaN`` (turned into advantage 0 by :func:`compute_advantages`).
    Source: Ahmadian et al., Back to Basics, arXiv 2402.14740.
    """
    grouped = grouped_rewards(rewards, num_generations)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    total = torch.nansum(grouped, dim=1, keepdim=True)
    baseline = (total - grouped) / (count - 1)
    return (grouped - baseline).view(-1)


def check_maxrl_rewards_stay_binary(config: Any) -> None:
    """MaxRL needs 0/1 rewards: reward shaping that makes them non-binary needs ``maxrl_reward_threshold``."""
    if config.maxrl_reward_threshold is not None:
        return
    for name, on in (
        ("overlong_cache_length", config.overlong_cache_length is not None),
        ("kl_in_reward", config.kl_in_reward and config.beta != 0.0),
        ("multi_objective_aggregation", config.multi_objective_aggregation == "normalize_then_sum"),
    ):
        if on:
            raise ValueError(
                f"{name} shapes the reward, but advantage_estimator={config.advantage_estimator!r} needs binary "
                f"rewards. Turn {name} off, or set maxrl_reward_threshold to binarize the shaped reward."
            )


_MAXRL_FIELDS = (
    VariantField(
        "maxrl_reward_threshold",
        None,
        "MaxRL: rewards >= this threshold count as successes. None = rewards must be 0/1.",
        parameter="reward_threshold",
        check=at_least(0, optional=True, note="or None"),
    ),
)


@ADVANTAGE_ESTIMATORS.register(
    "maxrl",
    group_relative=True,
    trl_scale_rewards="none",
    binary_rewards=True,
    fields=_MAXRL_FIELDS,
    checks=(check_maxrl_rewards_stay_binary,),
)
def maxrl_advantages(
    rewards: torch.Tensor, num_generations: int, reward_threshold: float | None = None
) -> torch.Tensor:
    """MaxRL: ``A_i = (r_i - p_g) / p_g`` with ``p_g`` the group's success rate; ``0`` for a group with ``p_g = 0``.

    Rewards must be binary (``0``/``1``). With ``reward_threshold`` set, rewards are first binarized as
    ``r >= reward_threshold``. Dividing by the success rate (instead of the std) weights the gradient of
    ``log p`` rather than ``p``, i.e. maximum likelihood of the correct answer.
    Source: MaxRL, arXiv 2602.02710 (Alg. 1); with a mean over samples this is the seed's ``(r_i - p)/(N p)``.
    """
    if reward_threshold is not None:
        rewards = torch.where(torch.isnan(rewards), rewards, (rewards >= reward_threshold).to(rewards.dtype))
    scored = rewards[~torch.isnan(rewards)]
    if not bool(((scored == 0) | (scored == 1)).all()):
        bad = scored[(scored != 0) & (scored != 1)][:5].tolist()
        raise ValueError(
            f"The 'maxrl' estimator needs binary rewards (0 or 1), got e.g. {bad}. Set maxrl_reward_threshold to "
            "binarize them (reward >= threshold counts as a success)."
        )
    grouped = grouped_rewards(rewards, num_generations)
    success_rate = torch.nanmean(grouped, dim=1, keepdim=True)
    advantages = (grouped - success_rate) / success_rate
    return torch.where(success_rate > 0, advantages, torch.zeros_like(advantages)).view(-1)


@ADVANTAGE_ESTIMATORS.register("batch", group_relative=True, trl_scale_rewards="batch")
def batch_normalized_advantages(rewards: torch.Tensor, num_generations: int, epsilon: float = 1e-4) -> torch.Tensor:
    """Batch-level normalization: ``A_i = (r_i - mean_g) / (std_batch + eps)``, ``std_batch`` over all raw rewards.

    TRL's ``scale_rewards="batch"``. Source: ScaleRL, arXiv 2510.13786 (batch-level advantage normalization).
    """
    grouped = grouped_rewards(rewards, num_generations)
    std = torch.nan_to_num(nan_std(rewards), nan=0.0)
    return ((grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (std + epsilon)).view(-1)


@ADVANTAGE_ESTIMATORS.register("scalerl", group_relative=True, trl_scale_rewards="none")
def scalerl_advantages(rewards: torch.Tensor, num_generations: int, epsilon: float = 1e-4) -> torch.Tensor:
    """ScaleRL: prompt-level centring, batch-level scaling of the *centred* advantages.

    ``Â_i = r_i - mean_g`` and ``A_i = Â_i / (std(Â) + eps)``, ``std(Â)`` (Bessel's correction) over every scored
    completion of ``rewards``, which the trainer restricts to the batch's training groups (groups dropped by
    zero-variance filtering or dynamic sampling are not passed in). Unlike ``batch`` (the std of the raw rewards, which
    also counts the spread between prompts), only the within-group spread scales the advantages.

    Source: ScaleRL, arXiv 2510.13786, §4 ("Â_std is the standard deviation of all advantages Â_i in a batch").
    """
    grouped = grouped_rewards(rewards, num_generations)
    centred = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).view(-1)
    std = torch.nan_to_num(nan_std(centred), nan=0.0)
    return centred / (std + epsilon)


@ADVANTAGE_ESTIMATORS.register("batch_zscore", trl_scale_rewards="batch")
def batch_zscore_advantages(rewards: torch.Tensor, num_generations: int, epsilon: float = 1e-4) -> torch.Tensor:
    """Batch standardisation: ``A_i = (r_i - mean_batch) / (std_batch + eps)``, both over every scored reward of the
    batch (no group baseline of its own).

    The last step of TRL's ``multi_objective_aggregation="normalize_then_sum"``, whose combined reward is already a
    sum of per-group z-scores (:func:`trl_reasoning.algorithms.shaping.normalize_then_sum_rewards`), so it is centred within each
    group. Source: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (GDPO-style decoupled normalisation).
    """
    grouped_rewards(rewards, num_generations)  # shape check
    std = nan_std(rewards) if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    return (rewards - torch.nanmean(rewards)) / (std + epsilon)


def normalize_advantages(advantages: torch.Tensor, epsilon: float = 1e-4) -> torch.Tensor:
    """``(A - mean(A)) / (std(A) + eps)`` over the batch's scored advantages (``NaN`` entries are left out and stay
    ``NaN``): TRL ``RLOOConfig.normalize_advantages`` ("normalization is done per generation batch")."""
    return (advantages - torch.nanmean(advantages)) / (nan_std(advantages) + epsilon)


def compute_advantages(
    rewards: torch.Tensor, num_generations: int, estimator: str = "grpo", normalize: bool = False, **kwargs
) -> torch.Tensor:
    """Advantages of a gathered batch with the estimator registered as ``estimator``.

    Args:
        rewards: ``(N,)`` one scalar reward per completion, groups of ``num_generations`` consecutive; ``NaN`` for an
            unscorable completion.
        num_generations: the group size ``G``. With ``G == 1`` (possible in evaluation) there is no baseline and
            every advantage is 0.
        estimator: a name in ``ADVANTAGE_ESTIMATORS``.
        normalize: standardise the advantages over the batch afterwards (:func:`normalize_advantages`, TRL's
            ``RLOOConfig.normalize_advantages``), before unscorable completions are set to 0.
        **kwargs: offered to the estimator; it receives those it takes as parameters (``epsilon``,
            ``reward_threshold``), so a caller can pass one set of options whatever the estimator.

    Returns:
        ``(N,)`` advantages, ``0`` wherever the estimator gave ``NaN`` (unscorable completions).
    """
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    if num_generations < 2:
        grouped_rewards(rewards, num_generations)
        return torch.zeros_like(rewards)
    kwargs = ADVANTAGE_ESTIMATORS.kwargs_for(estimator, kwargs)
    advantages = fn(rewards, num_generations, **kwargs)
    if normalize:
        advantages = normalize_advantages(advantages)
    return torch.nan_to_num(advantages, nan=0.0)


#: Estimators whose baseline is a statistic of the prompt's own group, so they need ``num_generations >= 2`` (their
#: ``group_relative`` trait; ``batch`` still subtracts the group mean).
GROUP_RELATIVE_ESTIMATORS = ADVANTAGE_ESTIMATORS.with_trait("group_relative")
