"""RLOO: REINFORCE leave-one-out with TRL's ``RLOOTrainer`` math on the ``GRPOTrainer`` machinery
(Ahmadian et al., arXiv 2402.14740).

advantage ``rloo`` · objective ``sequence_clip`` 0.2 · aggregation ``seq_mean_token_sum`` · KL in the reward with
``beta = 0.05`` · ``num_generations = 2`` (TRL's ``RLOOConfig`` defaults). Unlike TRL's ``RLOOTrainer``, it keeps
every ``GRPOTrainer`` option: vLLM importance-sampling correction, tools, entropy options.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class RLOOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with the defaults of TRL's `RLOOConfig`: `advantage_estimator="rloo"`,
    `policy_loss="sequence_clip"` (`epsilon=0.2`), `loss_aggregation="seq_mean_token_sum"`, `beta=0.05` applied in
    the reward (`kl_in_reward=True`, k1 estimator `log π_old − log π_ref` summed over the completion),
    `num_generations=2`.

    Paper: Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs,
    arXiv 2402.14740.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator", "rloo", source="RLOO (Ahmadian et al.) §2.3: leave-one-out baseline; TRL `RLOOTrainer`"
    )
    policy_loss: str | None = preset_default(
        "policy_loss",
        "sequence_clip",
        source="TRL 1.16 `rloo_trainer.py` (sequence-level ratio clipped at ε); the paper's RLOO is unclipped "
        "REINFORCE, which this equals with one update per batch",
    )
    epsilon: float = preset_default("epsilon", 0.2, source="TRL 1.16 `RLOOConfig.epsilon`")
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "seq_mean_token_sum",
        source="TRL 1.16 `rloo_trainer.py` (mean over sequences of summed token terms)",
    )
    kl_in_reward: bool = preset_default(
        "kl_in_reward",
        True,
        source="TRL 1.16 `rloo_trainer.py` (k1 KL subtracted from the sequence reward), RLOO's KL-shaped reward",
    )
    beta: float = preset_default(
        "beta", 0.05, source="TRL 1.16 `RLOOConfig.beta` (TRL's value; the paper's runs use others)"
    )
    num_generations: int | None = preset_default(
        "num_generations", 2, source="TRL 1.16 `RLOOConfig.num_generations`; RLOO's k = 2"
    )


class RLOOTrainer(ReasoningTrainer):
    """RLOO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with an [`RLOOConfig`]."""

    config_class = RLOOConfig
    _name = "RLOO"
    _tag = "rloo"
    paper = Paper(
        key="ahmadian2024back",
        title="Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
        authors="Arash Ahmadian and Chris Cremer and Matthias Gall{\\'e} and Marzieh Fadaee and Julia Kreutzer and "
        'Olivier Pietquin and Ahmet {\\"U}st{\\"u}n and Sara Hooker',
        year=2024,
        arxiv_id="2402.14740",
    )
