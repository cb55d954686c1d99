"""DAPO: clip-higher, token-mean loss and soft overlong punishment (Yu et al., arXiv 2503.14476).

advantage ``grpo`` · objective ``clip`` with ``eps_low=0.2, eps_high=0.28`` · aggregation ``token_mean`` ·
overlong shaping with ``L_cache = 20%`` of ``max_completion_length`` · dynamic sampling (at most 10 generation
rounds per batch) · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DAPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with DAPO's defaults: `advantage_estimator="grpo"`, `policy_loss="clip"`,
    `epsilon=0.2`, `epsilon_high=0.28` (clip-higher), `loss_aggregation="token_mean"`,
    `overlong_cache_length="auto"` (20% of `max_completion_length`), `dynamic_sampling=True` with
    `max_num_gen_batches=10`, `beta=0.0`.

    Paper: DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator", "grpo", source="DAPO §3 Eq. 9 (GRPO's group-normalised advantage)"
    )
    policy_loss: str | None = preset_default(
        "policy_loss", "clip", source="DAPO §3.1 Eq. 10 (clip-higher: decoupled lower and upper clip)"
    )
    epsilon: float = preset_default(
        "epsilon",
        0.2,
        source="DAPO §4.1 (ε_low = 0.2); verl `recipe/dapo/run_dapo_qwen2.5_32b.sh` `clip_ratio_low=0.2`",
    )
    epsilon_high: float | None = preset_default(
        "epsilon_high",
        0.28,
        source="DAPO §4.1 (ε_high = 0.28); verl `recipe/dapo/run_dapo_qwen2.5_32b.sh` `clip_ratio_high=0.28`",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "token_mean",
        source="the authors' code, not the paper's equation: verl `loss_agg_mode=token-mean` "
        "(`recipe/dapo/run_dapo_qwen2.5_32b.sh`) divides by every valid token of the batch; DAPO §3.3 Eq. 12 divides "
        "by the tokens of each prompt's group (that is `prompt_mean`)",
    )
    overlong_cache_length: int | str | None = preset_default(
        "overlong_cache_length",
        "auto",
        source="DAPO §3.4 Eq. 13 (soft overlong punishment); §4.1: a 4,096-token cache of a 20,480-token limit, "
        "so `auto` = 20% of `max_completion_length`",
    )
    dynamic_sampling: bool = preset_default(
        "dynamic_sampling", True, source="DAPO §3.2 Eq. 11 (keep groups with 0 < correct < G; sample until full)"
    )
    max_num_gen_batches: int = preset_default(
        "max_num_gen_batches",
        10,
        source="the authors' code: verl `recipe/dapo/run_dapo_qwen2.5_32b.sh` `max_num_gen_batches=10` (the paper "
        "samples until the batch is full, with no limit)",
    )
    beta: float = preset_default("beta", 0.0, source="DAPO §2.3 (KL term removed)")


class DAPOTrainer(ReasoningTrainer):
    """DAPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`DAPOConfig`]."""

    config_class = DAPOConfig
    _name = "DAPO"
    _tag = "dapo"
    paper = Paper(
        key="yu2025dapo",
        title="DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
        authors="Qiying Yu and Zheng Zhang and Ruofei Zhu and others",
        year=2025,
        arxiv_id="2503.14476",
    )
