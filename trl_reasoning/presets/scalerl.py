"""ScaleRL: the recipe of "The Art of Scaling Reinforcement Learning Compute for LLMs" (Khatri et al., arXiv
2510.13786).

advantage ``scalerl`` (group-centred, scaled by the batch std of the centred advantages) · objective ``cispo`` with cap ``c = 5.0`` · aggregation
``prompt_mean`` · zero-variance filtering · no-positive-resampling at pass rate ``0.9`` · FP32 LM head ·
``beta = 0`` · asynchronous rollouts with staleness bound ``k = 8`` (PipelineRL-8).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class ScaleRLConfig(ReasoningConfig):
    """[`ReasoningConfig`] with ScaleRL's defaults: `advantage_estimator="scalerl"`, `policy_loss="cispo"` with
    `epsilon_high=5.0` (the absolute cap on the importance ratio), `loss_aggregation="prompt_mean"`,
    `zero_variance_filtering=True`, `positive_resampling_threshold=0.9`, `cast_lm_head_to_fp32=True`, `beta=0.0`,
    and asynchronous rollouts with `max_staleness=8` (`async_rollouts=None`: wherever the run supports it; set
    `async_rollouts=False` to train synchronously).

    The `"scalerl"` estimator centres each reward on its group's mean and divides by the standard deviation of those
    centred advantages over the batch's training groups (ScaleRL §4; groups dropped by zero-variance filtering are
    not counted). TRL's `scale_rewards="batch"` (the raw rewards' std) stays available as `advantage_estimator="batch"`.

    Paper: The Art of Scaling Reinforcement Learning Compute for LLMs, arXiv 2510.13786.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "scalerl",
        source="ScaleRL §3.2 (batch-level advantage normalisation) and §4 (std of the batch's centred advantages)",
    )
    policy_loss: str | None = preset_default("policy_loss", "cispo", source="ScaleRL §3.2 (loss type: CISPO) and §4")
    epsilon_high: float | None = preset_default(
        "epsilon_high",
        5.0,
        source="ScaleRL App. A.17.2 (ε_max of 4, 5 and 8 perform alike; the value of the main runs is not stated); "
        "5.0 is TRL's recommended value",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation", "prompt_mean", source="ScaleRL §3.2 (loss aggregation: prompt average) and §4"
    )
    zero_variance_filtering: bool = preset_default(
        "zero_variance_filtering", True, source="ScaleRL §3.2 (zero-variance filtering) and §4"
    )
    positive_resampling_threshold: float | None = preset_default(
        "positive_resampling_threshold",
        0.9,
        source="ScaleRL §3.2 (adaptive prompt filtering: No-Positive-Resampling at pass rate ≥ 0.9) and §4",
    )
    cast_lm_head_to_fp32: bool = preset_default(
        "cast_lm_head_to_fp32", True, source="ScaleRL §3.2 (FP32 precision for LLM logits) and §4"
    )
    beta: float = preset_default("beta", 0.0, source="ScaleRL §4 (the ScaleRL objective has no KL term)")
    async_rollouts: bool | None = preset_default(
        "async_rollouts",
        None,
        source="ScaleRL §3.1 and §4 (asynchronous PipelineRL); None: on wherever the run supports it, synchronous "
        "with a warning elsewhere",
    )
    max_staleness: int = preset_default(
        "max_staleness", 8, source="ScaleRL §3.1 and §4 (PipelineRL with a maximum off-policyness of k = 8)"
    )


class ScaleRLTrainer(ReasoningTrainer):
    """The ScaleRL recipe on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`ScaleRLConfig`]."""

    config_class = ScaleRLConfig
    _name = "ScaleRL"
    _tag = "scalerl"
    paper = Paper(
        key="khatri2025scalerl",
        title="The Art of Scaling Reinforcement Learning Compute for LLMs",
        authors="Devvrit Khatri and Lovish Madaan and Rishabh Tiwari and others",
        year=2025,
        arxiv_id="2510.13786",
    )
