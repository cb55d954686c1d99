"""DPPO: a trust region on the estimated policy divergence instead of ratio clipping (Qi et al., arXiv 2602.04879).

advantage ``dr_grpo`` · objective ``dppo`` (``binary_tv``, ``delta = 0.15``, no cap on the importance weight) ·
aggregation ``seq_mean_token_sum_norm`` · ``beta = 0``: the authors' recipe (sail-sg/Stable-RL,
``examples/dppo_trainer/run_qwen30b_dppo.sh``: ``norm_adv_by_std_in_grpo=False``, ``loss_agg_mode=
seq-mean-token-sum-norm``, ``clip_ratio_c=10000``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DPPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with DPPO's defaults, as the authors run it: `advantage_estimator="dr_grpo"`
    (`norm_adv_by_std_in_grpo=False` in their script), `policy_loss="dppo"`, `dppo_divergence="binary_tv"` (threshold
    0.15; `"binary_kl"` uses 0.05), no cap on the importance weight (`dppo_is_cap=None`),
    `loss_aggregation="seq_mean_token_sum_norm"`, `beta=0.0`.

    Paper: Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "dr_grpo",
        source="the authors' script: verl `examples/dppo_trainer/run_qwen30b_dppo.sh` `norm_adv_by_std_in_grpo=False`; "
        "DPPO App. C.1 Eq. 23 (no std normalisation)",
    )
    policy_loss: str | None = preset_default(
        "policy_loss", "dppo", source="DPPO §4.3 Eq. 12 (divergence mask on the policy gradient)"
    )
    dppo_divergence: str = preset_default(
        "dppo_divergence", "binary_tv", source="DPPO §4.4 Eq. 13-14 (binary TV); `run_qwen30b_dppo.sh` `dppo_tv`"
    )
    dppo_threshold: float | None = preset_default(
        "dppo_threshold",
        None,
        source="`None` = 0.15 for TV, 0.05 for KL: DPPO App. C.1 and `run_qwen30b_dppo.sh` (`clip_ratio` 0.15 / "
        "0.05). The paper's App. E uses 0.2 for binary TV in most scaling runs",
    )
    dppo_topk: int = preset_default("dppo_topk", 20, source="DPPO §7.3 and App. B.1 (K = 20)")
    dppo_is_cap: float | None = preset_default(
        "dppo_is_cap",
        None,
        source="the authors' script: `run_qwen30b_dppo.sh` `clip_ratio_c=10000` (dual clip and truncated IS off); "
        "the paper's App. E caps the weight at C = 5 in its scaling runs",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "seq_mean_token_sum_norm",
        source="the authors' script: `run_qwen30b_dppo.sh` `loss_agg_mode=seq-mean-token-sum-norm`",
    )
    beta: float = preset_default(
        "beta", 0.0, source="the authors' script: `run_qwen30b_dppo.sh` `use_kl_loss=False`, `use_kl_in_reward=False`"
    )


class DPPOTrainer(ReasoningTrainer):
    """DPPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`DPPOConfig`]."""

    config_class = DPPOConfig
    _name = "DPPO"
    _tag = "dppo"
    paper = Paper(
        key="qi2026rethinking",
        title="Rethinking the Trust Region in LLM Reinforcement Learning",
        authors="Penghui Qi and Xiangxin Zhou and Zichen Liu and Tianyu Pang and Chao Du and Min Lin and Wee Sun Lee",
        year=2026,
        arxiv_id="2602.04879",
    )
