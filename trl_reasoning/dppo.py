"""DPPO: a trust region on the estimated policy divergence instead of ratio clipping (Qi et al., arXiv 2602.04879).

advantage ``grpo`` · objective ``dppo`` (``binary_tv``, ``delta = 0.15``, ratio cap ``C = 20``) ·
aggregation ``seq_mean_token_mean`` · ``beta = 0``. The authors' own recipe pairs it with
``advantage_estimator="dr_grpo"`` and ``loss_aggregation="seq_mean_token_sum_norm"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DPPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with DPPO's defaults: `advantage_estimator="grpo"`, `policy_loss="dppo"`,
    `dppo_divergence="binary_tv"` (threshold 0.15; `"binary_kl"` uses 0.05), `dppo_is_cap=20.0`,
    `loss_aggregation="seq_mean_token_mean"`, `beta=0.0`.

    Paper: Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "grpo")
    policy_loss: str | None = preset_default("policy_loss", "dppo")
    loss_aggregation: str | None = preset_default("loss_aggregation", "seq_mean_token_mean")


class DPPOTrainer(ReasoningTrainer):
    """DPPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`DPPOConfig`]."""

    config_class = DPPOConfig
    _tag_names = ["trl", "trl-reasoning", "dppo"]
    _name = "DPPO"
    _paper = {
        "title": "Rethinking the Trust Region in LLM Reinforcement Learning",
        "id": "2602.04879",
        "citation": bibtex(
            "qi2026rethinking",
            "Rethinking the Trust Region in LLM Reinforcement Learning",
            "Penghui Qi and Xiangxin Zhou and Zichen Liu and Tianyu Pang and Chao Du and Min Lin and Wee Sun Lee",
            2026,
            "2602.04879",
        ),
    }
