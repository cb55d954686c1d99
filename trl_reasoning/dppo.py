"""DPPO: a trust region on the estimated policy divergence instead of ratio clipping (Qi et al., arXiv 2602.04879).

advantage ``dr_grpo`` · objective ``dppo`` (``binary_tv``, ``delta = 0.15``, no cap on the importance weight) ·
aggregation ``seq_mean_token_sum_norm`` · ``beta = 0``: the authors' recipe (sail-sg/Stable-RL,
``examples/dppo_trainer/run_qwen30b_dppo.sh``: ``norm_adv_by_std_in_grpo=False``, ``loss_agg_mode=
seq-mean-token-sum-norm``, ``clip_ratio_c=10000``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DPPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with DPPO's defaults, as the authors run it: `advantage_estimator="dr_grpo"`
    (`norm_adv_by_std_in_grpo=False` in their script), `policy_loss="dppo"`, `dppo_divergence="binary_tv"` (threshold
    0.15; `"binary_kl"` uses 0.05), no cap on the importance weight (`dppo_is_cap=None`; their script sets
    `clip_ratio_c=10000` "for a fair comparison between GRPO and DPPO"), `loss_aggregation="seq_mean_token_sum_norm"`
    (their `loss_agg_mode`), `beta=0.0`.

    Paper: Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "dr_grpo")
    policy_loss: str | None = preset_default("policy_loss", "dppo")
    loss_aggregation: str | None = preset_default("loss_aggregation", "seq_mean_token_sum_norm")


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
