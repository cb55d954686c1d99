"""ScaleRL: the recipe of "The Art of Scaling Reinforcement Learning Compute for LLMs" (Khatri et al., arXiv
2510.13786).

advantage ``scalerl`` (group-centred, scaled by the batch std of the centred advantages) · objective ``cispo`` with cap ``c = 5.0`` · aggregation
``prompt_mean`` · zero-variance filtering · no-positive-resampling at pass rate ``0.9`` · FP32 LM head ·
``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class ScaleRLConfig(ReasoningConfig):
    """[`ReasoningConfig`] with ScaleRL's defaults: `advantage_estimator="scalerl"`, `policy_loss="cispo"` with
    `epsilon_high=5.0` (the absolute cap on the importance ratio), `loss_aggregation="prompt_mean"`,
    `zero_variance_filtering=True`, `positive_resampling_threshold=0.9`, `cast_lm_head_to_fp32=True`, `beta=0.0`.

    The `"scalerl"` estimator centres each reward on its group's mean and divides by the standard deviation of those
    centred advantages over the batch's training groups (ScaleRL §4; groups dropped by zero-variance filtering are
    not counted). TRL's `scale_rewards="batch"` (the raw rewards' std) stays available as `advantage_estimator="batch"`.

    Paper: The Art of Scaling Reinforcement Learning Compute for LLMs, arXiv 2510.13786.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "scalerl")
    policy_loss: str | None = preset_default("policy_loss", "cispo")
    loss_aggregation: str | None = preset_default("loss_aggregation", "prompt_mean")
    epsilon_high: float | None = preset_default("epsilon_high", 5.0)
    zero_variance_filtering: bool = preset_default("zero_variance_filtering", True)
    positive_resampling_threshold: float | None = preset_default("positive_resampling_threshold", 0.9)
    cast_lm_head_to_fp32: bool = preset_default("cast_lm_head_to_fp32", True)


class ScaleRLTrainer(ReasoningTrainer):
    """The ScaleRL recipe on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`ScaleRLConfig`]."""

    config_class = ScaleRLConfig
    _tag_names = ["trl", "trl-reasoning", "scalerl"]
    _name = "ScaleRL"
    _paper = {
        "title": "The Art of Scaling Reinforcement Learning Compute for LLMs",
        "id": "2510.13786",
        "citation": bibtex(
            "khatri2025scalerl",
            "The Art of Scaling Reinforcement Learning Compute for LLMs",
            "Devvrit Khatri and Lovish Madaan and Rishabh Tiwari and others",
            2025,
            "2510.13786",
        ),
    }
