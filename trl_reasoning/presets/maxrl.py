"""MaxRL: advantages normalized by the group's success rate, approximating maximum likelihood of success
(Tajwar et al., arXiv 2602.02710).

advantage ``maxrl`` (binary rewards) · objective ``clip`` 0.2 · aggregation ``token_mean`` · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class MaxRLConfig(ReasoningConfig):
    """[`ReasoningConfig`] with MaxRL's defaults: `advantage_estimator="maxrl"`, `policy_loss="clip"` (`epsilon=0.2`),
    `loss_aggregation="token_mean"`, `beta=0.0`. Rewards must be 0/1 unless `maxrl_reward_threshold` binarizes them;
    a reward function that returns anything else is named in the error.

    Paper: Maximum Likelihood Reinforcement Learning, arXiv 2602.02710.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "maxrl",
        source="MaxRL Algorithm 1; authors' code `tajwarfahim/maxrl` `compute_maxrl_outcome_advantage`",
    )
    policy_loss: str | None = preset_default(
        "policy_loss", "clip", source="MaxRL appendix objective (clipped ratio; inert when fully on-policy)"
    )
    epsilon: float = preset_default(
        "epsilon",
        0.2,
        source="the authors' code: `qwen3_experiments/run_qwen3_training.sh` `CLIP_RATIO_LOW=CLIP_RATIO_HIGH=0.2` (the "
        "paper gives no value)",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "token_mean",
        source="the authors' code (verl's default `loss_agg_mode: token-mean`, kept by `run_qwen3_training.sh`) and "
        "the paper's appendix objective (1/T, T = tokens of the mini-batch); Algorithm 1's estimator averages over "
        "samples",
    )
    beta: float = preset_default(
        "beta", 0.0, source="MaxRL appendix, Qwen3 hyperparameters (KL coefficient 0); `run_qwen3_training.sh`"
    )


class MaxRLTrainer(ReasoningTrainer):
    """MaxRL on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`MaxRLConfig`]."""

    config_class = MaxRLConfig
    _name = "MaxRL"
    _tag = "maxrl"
    paper = Paper(
        key="tajwar2026maximum",
        title="Maximum Likelihood Reinforcement Learning",
        authors="Fahim Tajwar and Guanning Zeng and Yueer Zhou and Yuda Song and Daman Arora and Yiding Jiang and "
        "Jeff Schneider and Ruslan Salakhutdinov and Haiwen Feng and Andrea Zanette",
        year=2026,
        arxiv_id="2602.02710",
    )
