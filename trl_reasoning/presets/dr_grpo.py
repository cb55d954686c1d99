"""Dr. GRPO: GRPO without its length and difficulty biases (Liu et al., arXiv 2503.20783).

advantage ``dr_grpo`` (no std division) · objective ``clip`` 0.2 · aggregation ``seq_mean_token_sum_norm``
(constant normalizer ``N * max_completion_length``) · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DrGRPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with Dr. GRPO's defaults: `advantage_estimator="dr_grpo"` (TRL's `scale_rewards="none"`),
    `policy_loss="clip"` (`epsilon=0.2`), `loss_aggregation="seq_mean_token_sum_norm"` (TRL's `loss_type="dr_grpo"`),
    `beta=0.0`.

    Paper: Understanding R1-Zero-Like Training: A Critical Perspective, arXiv 2503.20783.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "dr_grpo",
        source="Dr. GRPO §3.2 (std normalisation removed); `sail-sg/understand-r1-zero` `train_zero_math.py` "
        "`critic_type=drgrpo`",
    )
    policy_loss: str | None = preset_default("policy_loss", "clip", source="Dr. GRPO §3.2 (PPO's clipped objective)")
    epsilon: float = preset_default("epsilon", 0.2, source="Dr. GRPO App. G Table 6 (policy clip 0.2)")
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "seq_mean_token_sum_norm",
        source="the authors' code: Dr. GRPO Listing 1 and `train_zero_math.py` (`masked_sum` divided by the constant "
        "`generate_max_length`); §3.2 itself only removes the 1/|o_i| factor",
    )
    beta: float = preset_default("beta", 0.0, source="Dr. GRPO App. G Table 6 (KL coefficients 0)")


class DrGRPOTrainer(ReasoningTrainer):
    """Dr. GRPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`DrGRPOConfig`]."""

    config_class = DrGRPOConfig
    _name = "Dr. GRPO"
    _tag = "dr-grpo"
    paper = Paper(
        key="liu2025understanding",
        title="Understanding R1-Zero-Like Training: A Critical Perspective",
        authors="Zichen Liu and Changyu Chen and Wenjun Li and Penghui Qi and Tianyu Pang and Chao Du and Wee Sun Lee "
        "and Min Lin",
        year=2025,
        arxiv_id="2503.20783",
    )
