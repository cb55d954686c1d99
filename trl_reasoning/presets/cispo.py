"""CISPO: clipped importance-sampling weights, every token keeps its gradient (MiniMax-M1, arXiv 2506.13585).

advantage ``grpo`` · objective ``cispo`` with cap ``c = epsilon_high = 5.0`` · aggregation ``token_mean`` · ``beta = 0``
· the MiniMax-M1 recipe around it (§3.1–3.2): DAPO's dynamic sampling and overlong shaping, FP32 LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class CISPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with CISPO's defaults, the MiniMax-M1 recipe: `advantage_estimator="grpo"`,
    `policy_loss="cispo"`, `epsilon_high=5.0` (the absolute cap on the importance ratio, TRL's semantics; the paper
    gives no value, TRL recommends 5.0), `loss_aggregation="token_mean"`, `beta=0.0`, and, as MiniMax-M1 trains it
    (§3.1: DAPO's dynamic sampling and length penalty; §3.2: the LM head in FP32), `dynamic_sampling=True`,
    `overlong_cache_length="auto"` and `cast_lm_head_to_fp32=True`.

    For the CISPO objective alone (what `GRPOConfig(loss_type="cispo")` trains), turn the recipe off:
    `CISPOConfig(dynamic_sampling=False, overlong_cache_length=None, cast_lm_head_to_fp32=False)`.

    Paper: MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention, arXiv 2506.13585.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator", "grpo", source="MiniMax-M1 §3.1 (GRPO's group-normalised advantage, Eq. 2)"
    )
    policy_loss: str | None = preset_default(
        "policy_loss", "cispo", source="MiniMax-M1 §3.1 Eq. 4-5 (clipped importance-sampling weight, stop-gradient)"
    )
    epsilon_high: float | None = preset_default(
        "epsilon_high",
        5.0,
        source="TRL's semantics, which win here: an absolute cap, `sg(min(ρ, 5.0))` (TRL 1.16 `GRPOConfig.epsilon_high`, "
        "its recommended value; ScaleRL App. A.17.2 finds 4, 5 and 8 alike). MiniMax-M1 Eq. 5 writes the cap as "
        "`1 + ε_high^IS` and gives no value",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "token_mean",
        source='TRL\'s `loss_type="cispo"` (tokens of the whole batch); MiniMax-M1 Eq. 4 divides by the tokens of '
        "each prompt's group",
    )
    dynamic_sampling: bool = preset_default(
        "dynamic_sampling", True, source="MiniMax-M1 §3.1 (adopts DAPO's dynamic sampling)"
    )
    overlong_cache_length: int | str | None = preset_default(
        "overlong_cache_length",
        "auto",
        source="MiniMax-M1 §3.1 (adopts DAPO's length penalty); the 20% cache is DAPO's (§4.1)",
    )
    cast_lm_head_to_fp32: bool = preset_default(
        "cast_lm_head_to_fp32", True, source="MiniMax-M1 §3.2 (training/inference precision mismatch: FP32 LM head)"
    )
    beta: float = preset_default("beta", 0.0, source="MiniMax-M1 §3.1 (CISPO has no KL term)")


class CISPOTrainer(ReasoningTrainer):
    """CISPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`CISPOConfig`]."""

    config_class = CISPOConfig
    _name = "CISPO"
    _tag = "cispo"
    paper = Paper(
        key="minimax2025minimaxm1",
        title="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
        authors="MiniMax",
        year=2025,
        arxiv_id="2506.13585",
    )
