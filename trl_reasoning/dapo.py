"""DAPO: clip-higher, token-mean loss and soft overlong punishment (Yu et al., arXiv 2503.14476).

advantage ``grpo`` · objective ``clip`` with ``eps_low=0.2, eps_high=0.28`` · aggregation ``token_mean`` ·
overlong shaping with ``L_cache = 20%`` of ``max_completion_length`` · dynamic sampling (at most 10 generation
rounds per batch) · ``beta = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .trainer import ReasoningConfig, ReasoningTrainer, bibtex, preset_default


@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class DAPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with DAPO's defaults: `advantage_estimator="grpo"`, `policy_loss="clip"`,
    `epsilon=0.2`, `epsilon_high=0.28` (clip-higher), `loss_aggregation="token_mean"`,
    `overlong_cache_length="auto"` (20% of `max_completion_length`), `dynamic_sampling=True` with
    `max_num_gen_batches=10`, `beta=0.0`.

    Paper: DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476.
    """

    advantage_estimator: str | None = preset_default("advantage_estimator", "grpo")
    policy_loss: str | None = preset_default("policy_loss", "clip")
    loss_aggregation: str | None = preset_default("loss_aggregation", "token_mean")
    epsilon_high: float | None = preset_default("epsilon_high", 0.28)
    overlong_cache_length: int | str | None = preset_default("overlong_cache_length", "auto")
    dynamic_sampling: bool = preset_default("dynamic_sampling", True)


class DAPOTrainer(ReasoningTrainer):
    """DAPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`DAPOConfig`]."""

    config_class = DAPOConfig
    _tag_names = ["trl", "trl-reasoning", "dapo"]
    _name = "DAPO"
    _paper = {
        "title": "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
        "id": "2503.14476",
        "citation": bibtex(
            "yu2025dapo",
            "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
            "Qiying Yu and Zheng Zhang and Ruofei Zhu and others",
            2025,
            "2503.14476",
        ),
    }
