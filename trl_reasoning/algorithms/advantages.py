"""Advantage estimators: one reward per completion in, one advantage per completion out (or, for a token-level
estimator such as REINFORCE++'s, one advantage per completion token).

Layout follows TRL: a batch of ``N = P * G`` completions where the ``G`` completions of a prompt are consecutive,
so ``rewards.view(P, G)`` groups them. A ``NaN`` reward marks an *unscorable* completion (every reward function
returned ``None``, TRL's convention): it is left out of its group's statistics and gets advantage ``0``.

The estimators are computed once, on the whole gathered batch (all processes), never on a micro-batch.
Formulas and sources: ``docs/algorithms.md`` ("Advantage estimators").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .registry import Registry, VariantField, at_least, trait_field

AdvantageEstimator = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class EstimatorTraits:
    """What an advantage estimator needs or changes beyond its function, as its registration declares it."""

    group_relative: bool = trait_field(
        "its baseline is a statistic of the prompt's own group, so ``num_generations >= 2``.", False
    )
    trl_scale_rewards: str | None = trait_field(
        "TRL's ``scale_rewards`` value that means this estimator's scaling (``None``: ``\"none\"``)."
    )
    binary_rewards: bool = trait_field(
        "the rewards must be 0/1 unless the estimator's ``reward_threshold`` binarizes them.", False
    )
    token_level: bool = trait_field(
        "it returns one advantage per completion token, ``(N, T)``, and reads ``TOKEN_INPUTS``.", False
    )
    kl_in_return: bool = trait_field(
        "``beta``'s KL is in its per-token return: the loss adds no KL term and ``kl_in_reward`` must stay off.", False
    )


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", EstimatorTraits)


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
        (
            "MaxRL needs binary rewards. With a threshold, a reward `≥` threshold counts as a success (1), otherwise a "
            "failure (0). Without one, non-binary rewards raise an error naming the reward function."
        ),
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


#: The per-token inputs of a ``token_level`` estimator, ``(N, T)`` each, rows aligned with the rewards: the completion
#: tokens that count (``completion_mask``, 1/0) and the k1 KL of each token (``token_kl``,
#: :func:`trl_reasoning.algorithms.shaping.token_kl`). Whoever selects rows of the rewards selects the same rows here.
TOKEN_INPUTS = ("completion_mask", "token_kl")

#: OpenRLHF's floor on the batch variance of REINFORCE++'s advantages (``var.clamp(min=1e-8).rsqrt()``).
REINFORCE_PP_VARIANCE_FLOOR = 1e-8


def reinforce_pp_returns(
    rewards: torch.Tensor, token_kl: torch.Tensor, completion_mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """REINFORCE++'s return of every completion token, undiscounted (``γ = 1``):

    ``G_it = r_i − β Σ_{s ≥ t} m_is KL_is`` where ``m_it = 1``, ``0`` where ``m_it = 0``.

    It is the reward-to-go of the per-token reward ``−β KL_it`` on every counted token plus ``r_i`` on the last one:
    the scalar reward reaches every token, the KL penalty only the tokens before it. ``KL`` is the k1 estimate
    ``log π_old − log π_ref`` (no gradient); padding and tool-output tokens (``m = 0``) add no penalty. A row whose
    reward is ``NaN`` (unscorable) stays ``NaN`` on its counted tokens.

    Source: REINFORCE++ (Hu et al., arXiv 2501.03262), the token-level KL penalty and its return; OpenRLHF
    ``openrlhf/models/utils.py`` ``compute_reward`` (the reward at the last action token, ``−kl_coef · kl`` on each)
    and ``experience_maker.py`` ``get_cumulative_returns`` (the rewards masked by ``action_mask``, then summed from
    the end with ``γ = 1``).

    Args:
        rewards: ``(N,)`` one reward per completion (centred already for the ``-baseline`` variant).
        token_kl: ``(N, T)`` the per-token KL estimate.
        completion_mask: ``(N, T)`` 1 for the tokens that count in the loss.
        beta: the KL coefficient ``β``.
    """
    counted = completion_mask.bool()
    zeros = torch.zeros_like(token_kl)
    # where(), not a product with the mask: a non-finite value on an uncounted token must not reach the sums
    penalty = torch.where(counted, beta * token_kl.detach(), zeros).flip(-1).cumsum(-1).flip(-1)
    returns = rewards.to(token_kl.dtype).unsqueeze(1) - penalty
    return torch.where(counted, returns, zeros)


def whiten_over_tokens(
    values: torch.Tensor, completion_mask: torch.Tensor, variance_floor: float = REINFORCE_PP_VARIANCE_FLOOR
) -> torch.Tensor:
    """Global (batch) normalisation over tokens: ``(A − mean) / sqrt(max(var, variance_floor))``.

    ``mean`` and ``var`` run over every entry of the batch where ``completion_mask`` is 1 and ``values`` is not
    ``NaN``, each token counting once (a long completion weighs more than a short one), and ``var`` is the biased
    variance (divided by the count ``n``, not ``n − 1``). Every other entry (padding, tool output, an unscorable row)
    is ``0`` and moves neither statistic.

    Source: OpenRLHF ``experience_maker.py`` ``compute_advantages_and_returns`` (the masked mean over
    ``action_mask``, the masked biased variance, ``rsqrt`` of the variance clamped at ``1e-8``). OpenRLHF leaves
    ``(0 − mean) · rstd`` at padding positions, which its loss masks out; here they are ``0``.
    """
    valid = completion_mask.bool() & ~torch.isnan(values)
    zeros = torch.zeros_like(values)
    count = valid.sum().clamp(min=1).to(values.dtype)
    mean = torch.where(valid, values, zeros).sum() / count
    variance = torch.where(valid, (values - mean) ** 2, zeros).sum() / count
    return torch.where(valid, (values - mean) * variance.clamp(min=variance_floor).rsqrt(), zeros)


def check_kl_in_return(config: Any) -> None:
    """A ``kl_in_return`` estimator already puts ``beta``'s KL into each token's return and normalises over the
    batch's tokens: RLOO's sequence-level ``kl_in_reward`` would subtract the KL a second time and
    ``normalize_advantages`` standardise once more per completion; a negative ``beta`` would reward divergence."""
    name = config.advantage_estimator
    if config.kl_in_reward:
        raise ValueError(
            f"kl_in_reward=True subtracts beta's KL from the sequence reward, but advantage_estimator={name!r} "
            "already subtracts it from every token's return: the KL would count twice. Set kl_in_reward=False "
            "(beta still applies, in the return)."
        )
    if config.normalize_advantages:
        raise ValueError(
            f"normalize_advantages=True standardises the advantages per completion, but advantage_estimator={name!r} "
            "already normalises them over every completion token of the batch. Set normalize_advantages=False."
        )
    if config.beta < 0:
        raise ValueError(
            f"beta must be >= 0 with advantage_estimator={name!r} (the KL penalty in each token's return; 0 turns "
            f"it off), got {config.beta}."
        )


@ADVANTAGE_ESTIMATORS.register("reinforce_pp", token_level=True, kl_in_return=True, checks=(check_kl_in_return,))
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    completion_mask: torch.Tensor | None = None,
    token_kl: torch.Tensor | None = None,
    beta: float = 0.0,
    variance_floor: float = REINFORCE_PP_VARIANCE_FLOOR,
) -> torch.Tensor:
    """REINFORCE++: each token's return ``r_i − β Σ_{s≥t} KL_is``, normalised over all completion tokens of the batch.

    ``A_it = whiten(G_it)``: :func:`reinforce_pp_returns` then :func:`whiten_over_tokens` (mean and biased variance
    over the batch's counted tokens, the variance floored at ``1e-8``). No group baseline: the batch mean is the
    only one. Returns ``(N, T)``, ``0`` on padding. Without ``token_kl`` (or with ``beta = 0``) every token of a
    completion shares ``r_i`` before the normalisation. Source: REINFORCE++ (Hu et al., arXiv 2501.03262); OpenRLHF
    ``--algo.advantage.estimator reinforce`` (``experience_maker.py``).
    """
    grouped_rewards(rewards, num_generations)  # shape check
    if completion_mask is None or completion_mask.dim() != 2 or completion_mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            "REINFORCE++'s advantages are per token: pass completion_mask, one (N, T) row of 0/1 per completion, "
            f"got {None if completion_mask is None else tuple(completion_mask.shape)} for {rewards.numel()} rewards."
        )
    dtype = rewards.dtype if token_kl is None else torch.promote_types(rewards.dtype, token_kl.dtype)
    kl = torch.zeros(completion_mask.shape, dtype=dtype, device=rewards.device) if token_kl is None else token_kl
    # an unscorable completion (NaN reward) has NaN returns: left out of the statistics, advantage 0
    returns = reinforce_pp_returns(rewards.to(dtype), kl.to(dtype), completion_mask, beta)
    return whiten_over_tokens(returns, completion_mask, variance_floor)


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_pp_baseline",
    group_relative=True,
    token_level=True,
    kl_in_return=True,
    checks=(check_kl_in_return,),
)
def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    completion_mask: torch.Tensor | None = None,
    token_kl: torch.Tensor | None = None,
    beta: float = 0.0,
    variance_floor: float = REINFORCE_PP_VARIANCE_FLOOR,
) -> torch.Tensor:
    """REINFORCE++-baseline: ``r_i − mean_g``, then REINFORCE++'s per-token return and normalisation over the batch.

    ``r̃_i = r_i − mean_g`` (over the group's scored rewards, no std), then :func:`reinforce_pp_advantages` on
    ``r̃``: the return ``r̃_i − β Σ_{s≥t} KL_is`` is re-centred on the batch's token mean and scaled by the batch's
    token std. Returns ``(N, T)``. Source: REINFORCE++ (Hu et al., arXiv 2501.03262), the ``-baseline`` variant for
    several samples per prompt; OpenRLHF ``--algo.advantage.estimator reinforce_baseline`` (``experience_maker.py``:
    ``rewards - rewards.mean(-1)`` per prompt, then the same return and normalisation as ``reinforce``).
    """
    grouped = grouped_rewards(rewards, num_generations)
    centred = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).view(-1)
    return reinforce_pp_advantages(centred, num_generations, completion_mask, token_kl, beta, variance_floor)


def zero_advantages(
    rewards: torch.Tensor, estimator: str, completion_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Advantages of ``0`` in the estimator's shape: ``(N, T)`` like ``completion_mask`` for a ``token_level`` one
    (when the mask is given), ``(N,)`` otherwise."""
    if ADVANTAGE_ESTIMATORS.traits(estimator).token_level and completion_mask is not None:
        return torch.zeros(completion_mask.shape, dtype=rewards.dtype, device=rewards.device)
    return torch.zeros_like(rewards)


def per_completion(advantages: torch.Tensor) -> torch.Tensor:
    """One number per completion, for tables and logs: the advantage itself, or, for ``(N, T)`` token-level advantages,
    its first token's (the normalised return of the whole completion, REINFORCE++'s sequence-level value)."""
    return advantages[:, 0] if advantages.dim() == 2 else advantages


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
            ``reward_threshold``; a token-level estimator's :data:`TOKEN_INPUTS` and ``beta``), so a caller can pass
            one set of options whatever the estimator.

    Returns:
        ``(N,)`` advantages, ``0`` wherever the estimator gave ``NaN`` (unscorable completions); ``(N, T)`` from a
        ``token_level`` estimator (REINFORCE++'s), ``0`` on padding.
    """
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    if num_generations < 2:
        grouped_rewards(rewards, num_generations)
        return zero_advantages(rewards, estimator, kwargs.get("completion_mask"))
    kwargs = ADVANTAGE_ESTIMATORS.kwargs_for(estimator, kwargs)
    advantages = fn(rewards, num_generations, **kwargs)
    if normalize:
        if advantages.dim() != 1:
            raise ValueError(
                f"normalize_advantages standardises one advantage per completion; advantage_estimator={estimator!r} "
                "gives one per token and normalises them over the batch itself."
            )
        advantages = normalize_advantages(advantages)
    return torch.nan_to_num(advantages, nan=0.0)
