"""Which groups train: DAPO's dynamic sampling and ScaleRL's zero-variance filtering, and the pass rates of
ScaleRL's no-positive-resampling, as pure functions and registered strategies (no TRL import). Which prompts get
sampled (the samplers and the state a checkpoint keeps) is :mod:`trl_reasoning.algorithms.prompt_sampling`.

A *group* is the ``num_generations`` completions of one prompt, stored as consecutive rows. Rewards are the combined
task rewards before shaping (``NaN`` = unscorable), so a group is judged on what the verifier said, not on length
penalties: DAPO filters on accuracy.

Sources: DAPO, arXiv 2503.14476 (dynamic sampling); ScaleRL, arXiv 2510.13786 (zero-variance filtering,
no-positive-resampling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .advantages import grouped_rewards
from .registry import Registry, VariantField, one_of


def informative_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``True`` for each group whose scored rewards are not all equal (bool, one per group).

    A group with fewer than two scored (non-``NaN``) completions has nothing to compare and counts as
    uninformative: its advantages are all zero under every group-relative estimator.
    """
    grouped = grouped_rewards(rewards, num_generations)
    scored = ~torch.isnan(grouped)
    high = torch.where(scored, grouped, torch.full_like(grouped, -torch.inf)).amax(dim=1)
    low = torch.where(scored, grouped, torch.full_like(grouped, torch.inf)).amin(dim=1)
    return (scored.sum(dim=1) >= 2) & (high > low)


#: The task-reward values for which "a pass is reward > 0" needs no threshold: a correctness reward (0/1, or -1/+1,
#: or -1/0/1 with a penalty for unparsable answers).
CORRECTNESS_REWARD_VALUES = (-1.0, 0.0, 1.0)


def is_correctness_reward(rewards: torch.Tensor) -> bool:
    """Whether every scored (non-``NaN``) value of ``rewards`` is in :data:`CORRECTNESS_REWARD_VALUES`."""
    scored = rewards[~torch.isnan(rewards)]
    allowed = torch.tensor(CORRECTNESS_REWARD_VALUES, dtype=scored.dtype, device=scored.device)
    return bool(torch.isin(scored, allowed).all())


def group_pass_rates(rewards: torch.Tensor, num_generations: int, threshold: float | None = None) -> torch.Tensor:
    """Share of each group's scored completions that pass (``NaN`` for a group with none scored): task reward
    ``>= threshold``, or ``> 0`` without a threshold.

    With a 0/1 (or ±1) correctness reward and no threshold this is the prompt's pass rate, as ScaleRL's
    no-positive-resampling uses.
    """
    grouped = grouped_rewards(rewards, num_generations)
    scored = ~torch.isnan(grouped)
    passed = ((grouped > 0) if threshold is None else (grouped >= threshold)) & scored
    counts = scored.sum(dim=1)
    rates = passed.sum(dim=1).to(torch.float64) / counts.clamp(min=1)
    return torch.where(counts > 0, rates, torch.full_like(rates, torch.nan))


def select_groups(informative: Sequence[bool], target: int) -> tuple[list[int], list[bool]]:
    """Choose ``target`` groups from candidates listed in generation order (DAPO's dynamic sampling).

    Returns ``(chosen, active)``: the candidate positions, in order, of the first ``target`` informative groups, then,
    if there are fewer, of the first uninformative ones as fillers; ``active[j]`` says whether ``chosen[j]`` is a
    real (informative) group. Fillers keep the batch shape fixed and train nothing (loss weight 0).
    """
    if target < 0:
        raise ValueError(f"target must be >= 0, got {target}.")
    kept = [i for i, flag in enumerate(informative) if flag][:target]
    missing = target - len(kept)
    if missing > len(informative) - len(kept):
        raise ValueError(f"Cannot fill {target} groups from {len(informative)} candidates.")
    fillers = [i for i, flag in enumerate(informative) if not flag][:missing]
    chosen = kept + fillers
    return chosen, [True] * len(kept) + [False] * len(fillers)


# ---------------------------------------------------------------------------------------------------------------------
# Group selection: which generated groups a step trains on, and whether to generate more
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class SampledRound:
    """One generation round as a selection strategy sees it: the round's ``rows`` (opaque here), its gathered shaped
    ``rewards`` ``(N,)``, ``informative`` ``(N / G,)`` bool (task rewards not all equal) and, for logging, the
    ``task_rewards`` ``(N,)`` they were judged on and the ``completion_tokens`` the round generated (all processes)."""

    rows: Any
    rewards: torch.Tensor
    informative: torch.Tensor
    task_rewards: torch.Tensor | None = None
    completion_tokens: int | None = None


@dataclass
class GroupPlan:
    """The outcome of :func:`sample_groups`: the rounds generated, their groups' informative flags, the groups chosen
    for the batch (indices over all rounds' groups, in batch order), which of them train (``None``: all, no selection
    was made), whether the rounds ran out before the batch was full, and whether the batch has to be rebuilt from the
    rounds' rows."""

    rounds: list[SampledRound]
    informative: torch.Tensor  # every round's groups, concatenated
    chosen: list[int]
    active: torch.Tensor | None
    cap_hit: bool
    regroup: bool

    def row_sources(self, num_generations: int) -> list[tuple[int, int]]:
        """``(round, row within the round)`` of every row of the batch, group by group."""
        round_of_group = [index for index, r in enumerate(self.rounds) for _ in range(r.informative.numel())]
        first_group = [0]
        for r in self.rounds[:-1]:
            first_group.append(first_group[-1] + r.informative.numel())
        return [
            (round_of_group[g], (g - first_group[round_of_group[g]]) * num_generations + j)
            for g in self.chosen
            for j in range(num_generations)
        ]


class GroupSelection:
    """A group-selection strategy. This base trains every group of one round; subclasses override what differs.

    ``rounds(limit)`` caps the generation rounds (``limit`` = ``max_num_gen_batches``), ``enough`` stops them early,
    ``select`` picks the groups (and which of them train), ``regroup`` says whether the batch is rebuilt from the
    rounds' rows (necessarily so when more than one round may run).
    """

    regroup = False

    def rounds(self, limit: int) -> int:
        return 1

    def enough(self, rounds: list[SampledRound], target: int) -> bool:
        return True

    def select(self, informative: torch.Tensor, target: int) -> tuple[list[int], torch.Tensor | None]:
        return list(range(informative.numel())), None


GROUP_SELECTIONS: Registry[type[GroupSelection]] = Registry("group selection")


@GROUP_SELECTIONS.register("all")
class AllGroups(GroupSelection):
    """Every group trains (GRPO, TRL's behaviour)."""


@GROUP_SELECTIONS.register("zero_variance")
class ZeroVarianceFiltering(GroupSelection):
    """ScaleRL's zero-variance filtering: groups whose task rewards are all equal train nothing; nothing more is
    generated (ScaleRL §3.2)."""

    def select(self, informative: torch.Tensor, target: int) -> tuple[list[int], torch.Tensor | None]:
        return list(range(informative.numel())), informative.clone()


#: How extra dynamic-sampling rounds are sized: from the measured keep rate, or a full batch each (verl's DAPO).
EXTRA_ROUND_SIZES = ("keep_rate", "full")


def _check_round_limit(name: str, value: Any) -> None:
    """The round limit of dynamic sampling is an ``int >= 1``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    if value < 1:
        raise ValueError(
            f"{name} must be >= 1 (the number of generation rounds dynamic sampling may run per batch), got {value}."
        )


_DYNAMIC_SAMPLING_FIELDS = (
    VariantField(
        "max_num_gen_batches",
        10,
        "The most generation rounds (the dataloader's batch included) dynamic sampling runs for one batch.",
        check=_check_round_limit,
    ),
    VariantField(
        "extra_round_size",
        "keep_rate",
        (
            'How many prompts an extra dynamic-sampling round generates: `"keep_rate"` sizes it from the share of '
            "informative groups measured so far in the step (`ceil(missing / keep rate)` groups, whole rows on every "
            'process, at most a full batch; `algorithms.group_selection.extra_round_groups`); `"full"` generates a '
            "full generation batch every round, as verl's DAPO does. Which groups train follows the same rule either "
            "way."
        ),
        check=one_of(EXTRA_ROUND_SIZES),
    ),
)


@GROUP_SELECTIONS.register("dynamic", fields=_DYNAMIC_SAMPLING_FIELDS)
class DynamicSampling(GroupSelection):
    """DAPO's dynamic sampling: generate until ``target`` informative groups, at most ``limit`` rounds; keep exactly
    ``target`` groups, uninformative fillers (weight 0) when the rounds ran out (DAPO §3.2 Eq. 11)."""

    regroup = True

    def rounds(self, limit: int) -> int:
        return limit

    def enough(self, rounds: list[SampledRound], target: int) -> bool:
        return sum(int(r.informative.sum()) for r in rounds) >= target

    def select(self, informative: torch.Tensor, target: int) -> tuple[list[int], torch.Tensor | None]:
        chosen, active = select_groups(informative.tolist(), target)
        return chosen, torch.tensor(active, dtype=torch.bool, device=informative.device)


def extra_round_groups(
    kept: int, generated: int, target: int, full_round: int, num_processes: int, num_generations: int
) -> int:
    """The number of groups the next dynamic-sampling round generates when sized from the keep rate.

    ``kept`` informative groups were found among the ``generated`` ones so far this step; ``target - kept`` are still
    missing. At the measured rate ``kept / generated`` they need ``ceil(missing * generated / kept)`` groups. That is
    rounded up to the smallest unit every process can hold whole rows of (each of the ``num_processes`` generates the
    same number of rows: a multiple of ``num_processes / gcd(num_generations, num_processes)`` groups) and capped at
    ``full_round``, a full batch, which is also what a step with no informative group yet generates (no rate to go by).
    """
    missing = target - kept
    if missing <= 0:
        return 0
    if kept == 0 or generated == 0:
        return full_round
    needed = math.ceil(missing * generated / kept)
    unit = num_processes // math.gcd(num_generations, num_processes)
    return min(full_round, math.ceil(needed / unit) * unit)


def group_selection_name(dynamic_sampling: bool, zero_variance_filtering: bool) -> str:
    """The strategy a config's switches ask for (dynamic sampling already drops uninformative groups)."""
    if dynamic_sampling:
        return "dynamic"
    return "zero_variance" if zero_variance_filtering else "all"


def resolve_group_selection(args: Any) -> str:
    """The registered strategy a config asks for: its ``group_selection`` name, or the one its ``dynamic_sampling`` /
    ``zero_variance_filtering`` switches imply when that is ``None``. Raises a ``ValueError`` naming the field for an
    unknown name, or for a name that contradicts a switch that is on."""
    implied = group_selection_name(args.dynamic_sampling, args.zero_variance_filtering)
    chosen = getattr(args, "group_selection", None)
    if chosen is None:
        return implied
    if chosen not in GROUP_SELECTIONS:
        raise ValueError(
            f"Unknown group_selection {chosen!r}. Allowed values: {', '.join(GROUP_SELECTIONS.names())} (register "
            "your own with @GROUP_SELECTIONS.register), or None."
        )
    if implied != "all" and chosen != implied:
        switch = "dynamic_sampling" if args.dynamic_sampling else "zero_variance_filtering"
        raise ValueError(
            f"group_selection={chosen!r} contradicts {switch}=True (which means group_selection={implied!r}). Set "
            f"{switch}=False to use {chosen!r}, or drop group_selection."
        )
    return chosen


def sample_groups(
    strategy: str,
    score_round: Callable[[int, int], SampledRound],
    target: int,
    max_rounds: int,
    next_round_groups: Callable[[list[SampledRound]], int] | None = None,
) -> GroupPlan:
    """Run generation rounds with ``score_round(round_index, num_groups)`` as the strategy ``strategy`` asks, then
    choose the batch's ``target`` groups. The first round is a full batch (``target`` groups); an extra round has
    ``next_round_groups(rounds so far)`` groups (a full batch when ``None``, as verl's DAPO generates; no more rounds
    when it returns 0). Every decision
    reads only gathered rewards, so all processes take the same ones."""
    selection = GROUP_SELECTIONS.get(strategy)()
    rounds: list[SampledRound] = []
    for index in range(selection.rounds(max_rounds)):
        num_groups = target if index == 0 or next_round_groups is None else next_round_groups(rounds)
        if num_groups <= 0:  # the sizer has no prompts left to offer (every prompt retired)
            break
        rounds.append(score_round(index, num_groups))
        if selection.enough(rounds, target):
            break
    informative = torch.cat([r.informative for r in rounds])
    chosen, active = selection.select(informative, target)
    cap_hit = selection.regroup and not selection.enough(rounds, target)
    return GroupPlan(rounds, informative, chosen, active, cap_hit, selection.regroup)
