"""MaxRL: advantages normalized by the group's success rate, approximating maximum likelihood of success
(Tajwar et al., arXiv 2602.02710).

advantage ``maxrl`` (binary rewards) · objective ``clip`` 0.2 · aggregation ``token_mean`` · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class MaxRLConfig(ReasoningConfig):
    """[`ReasoningConfig`] with MaxRL's defaults: `advantage_estimator="maxrl"`, `policy_loss="clip"` (`epsilon=0.2`),
    `loss_aggregation="token_mean"`, `beta=0.0`. Rewards must be 0/1 unless `maxrl_reward_threshold` binarizes them;
    a reward function that returns anything else is named in the error.

    Paper: Maximum Likelihood Reinforcement Learning, arXiv 2602.02710.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "maxrl")
    policy_loss: str | None = preset_default("policy_loss", "clip")
    loss_aggregation: str | None = preset_default("loss_aggregation", "token_mean")


class MaxRLTrainer(ReasoningTrainer):
    """MaxRL on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`MaxRLConfig`]."""

    config_class = MaxRLConfig
    _tag_names = ["trl", "trl-reasoning", "maxrl"]
    _name = "MaxRL"
    _paper = {
        "title": "Maximum Likelihood Reinforcement Learning",
        "id": "2602.02710",
        "citation": bibtex(
            "tajwar2026maximum",
            "Maximum Likelihood Reinforcement Learning",
            "Fahim Tajwar and Guanning Zeng and Yueer Zhou and Yuda Song and Daman Arora and Yiding Jiang and "
            "Jeff Schneider and Ruslan Salakhutdinov and Haiwen Feng and Andrea Zanette",
            2026,
            "2602.02710",
        ),
    }
