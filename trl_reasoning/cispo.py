"""CISPO: clipped importance-sampling weights, every token keeps its gradient (MiniMax-M1, arXiv 2506.13585).

advantage ``grpo`` · objective ``cispo`` with cap ``c = epsilon_high = 5.0`` · aggregation ``token_mean`` · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class CISPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with CISPO's defaults: `advantage_estimator="grpo"`, `policy_loss="cispo"`,
    `epsilon_high=5.0` (the absolute cap on the importance ratio, TRL's semantics), `loss_aggregation="token_mean"`,
    `beta=0.0`.

    Paper: MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, arXiv 2506.13585.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "grpo")
    policy_loss: str | None = preset_default("policy_loss", "cispo")
    loss_aggregation: str | None = preset_default("loss_aggregation", "token_mean")
    epsilon_high: float | None = preset_default("epsilon_high", 5.0)


class CISPOTrainer(ReasoningTrainer):
    """CISPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`CISPOConfig`]."""

    config_class = CISPOConfig
    _tag_names = ["trl", "trl-reasoning", "cispo"]
    _name = "CISPO"
    _paper = {
        "title": "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
        "id": "2506.13585",
        "citation": bibtex(
            "minimax2025minimaxm1",
            "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
            "MiniMax",
            2025,
            "2506.13585",
        ),
    }
