"""GSPO: one length-normalised importance ratio per sequence, clipped at the sequence level (Zheng et al., Qwen team,
arXiv 2507.18071).

advantage ``grpo`` · objective ``gspo`` (``clip`` on ``s_i = exp(mean_t log(pi / pi_old))``, TRL's
``importance_sampling_level="sequence"``) with ``eps_low = 3e-4, eps_high = 4e-4`` · aggregation
``seq_mean_token_mean`` (TRL's ``loss_type="grpo"``) · ``beta = 0`` · each rollout batch trained as 4 optimizer
steps (``steps_per_generation = 4`` optimizer steps, ``4 × gradient_accumulation_steps`` micro-batches): TRL's
documented recipe (its paper index).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import OptimizerStepsPerGeneration, ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default

#: GSPO §5.1: each rollout batch is partitioned into four minibatches, one optimizer step each.
PAPER_MINIBATCHES = 4


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class GSPOConfig(ReasoningConfig):
    """[`ReasoningConfig`] with GSPO's defaults, TRL's documented recipe for the paper's setting:
    `advantage_estimator="grpo"`, `policy_loss="gspo"` (the clipped objective on one length-normalised ratio per
    sequence; it sets TRL's `importance_sampling_level="sequence"`), `epsilon=3e-4`, `epsilon_high=4e-4`,
    `loss_aggregation="seq_mean_token_mean"` (TRL's `loss_type="grpo"`), `beta=0.0`, and each rollout batch trained
    as four optimizer steps: `steps_per_generation=4` with `gradient_accumulation_steps=1`. The result is what
    `GRPOConfig(importance_sampling_level="sequence", loss_type="grpo", beta=0.0, epsilon=3e-4, epsilon_high=4e-4,
    gradient_accumulation_steps=1, steps_per_generation=4)` trains.

    The sequence ratio only leaves 1 off-policy: from the second optimizer step of each rollout batch, with
    `num_iterations > 1`, or with asynchronous rollouts. Fully on-policy (`steps_per_generation` equal to
    `gradient_accumulation_steps`, one iteration) GSPO's gradient is GRPO's with sequence-mean aggregation.

    Where the paper and TRL's recipe differ, or the paper is silent:

    - The paper splits each rollout batch into four minibatches, one optimizer update each (§5.1). TRL counts
      `steps_per_generation` in micro-batches (its recipe: "must be 4 times gradient_accumulation_steps"); the
      preset's default counts optimizer steps, so with `gradient_accumulation_steps=g` it becomes `4 * g`
      micro-batches and each rollout batch still trains as four updates. A `steps_per_generation` you pass is TRL's
      micro-batches, as in `GRPOConfig`. A `generation_batch_size` you set replaces the preset's default (TRL refuses
      the two together), and `steps_per_generation` then follows from it, as in TRL.
    - The paper gives no batch or group size; the preset keeps TRL's `per_device_train_batch_size=8` and
      `num_generations=8` (a generation batch of 32 completions, 4 prompts, per process).

    A rollout batch is held in memory only, by TRL as here: a resume continues exactly as the uninterrupted run from
    a checkpoint between two rollout batches (`save_steps` a multiple of 4 with the defaults); from one inside a
    rollout batch, its prompts are sampled again with the checkpoint's weights and the run departs from the
    uninterrupted one (`GRPOTrainer` does the same). Asynchronous rollouts with `async_generator="process"` or
    `"server"` need one generation per optimizer step (`steps_per_generation` equal to `gradient_accumulation_steps`:
    the pipeline's staleness is then what moves the ratio off 1), and the config refuses them otherwise; the
    in-process generator takes the defaults.

    Paper: Group Sequence Policy Optimization, arXiv 2507.18071.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "grpo",
        source="GSPO §4.1 Eq. 6 (the group's rewards standardised: GRPO's advantage); TRL's paper index keeps "
        '`scale_rewards="group"`',
    )
    policy_loss: str | None = preset_default(
        "policy_loss",
        "gspo",
        source="GSPO §4.1 Eq. 5 and 7 (the clipped objective on the length-normalised sequence ratio s_i); TRL's paper "
        'index `importance_sampling_level="sequence"`',
    )
    epsilon: float = preset_default(
        "epsilon", 3e-4, source="GSPO §5.1 (left clipping range 3e-4 in Eq. 5); TRL's paper index `epsilon=3e-4`"
    )
    epsilon_high: float | None = preset_default(
        "epsilon_high",
        4e-4,
        source="GSPO §5.1 (right clipping range 4e-4 in Eq. 5); TRL's paper index `epsilon_high=4e-4`",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "seq_mean_token_mean",
        source="GSPO §4.1 Eq. 5 (the mean over the group's sequences; every token of a sequence carries its term); "
        'TRL\'s paper index `loss_type="grpo"`',
    )
    beta: float = preset_default(
        "beta",
        0.0,
        source="GSPO §4.1 Eq. 5 (no KL term); TRL's paper index `beta=0.0`, citing a comment on volcengine/verl "
        "PR 2775",
    )
    gradient_accumulation_steps: int = preset_default(
        "gradient_accumulation_steps",
        1,
        source="TRL's paper index `gradient_accumulation_steps=1` (TRL's default)",
    )
    steps_per_generation: int | None = preset_default(
        "steps_per_generation",
        OptimizerStepsPerGeneration(PAPER_MINIBATCHES),
        source="GSPO §5.1 (each rollout batch partitioned into four minibatches for gradient updates); TRL's paper "
        "index `steps_per_generation=4` with `gradient_accumulation_steps=1`. Counted in optimizer steps: "
        "`4 × gradient_accumulation_steps` micro-batches",
    )


class GSPOTrainer(ReasoningTrainer):
    """GSPO on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`GSPOConfig`]."""

    config_class = GSPOConfig
    _name = "GSPO"
    _tag = "gspo"
    paper = Paper(
        key="zheng2025gspo",
        title="Group Sequence Policy Optimization",
        authors="Chujie Zheng and Shixuan Liu and Mingze Li and Xiong-Hui Chen and Bowen Yu and Chang Gao and Kai Dang "
        "and Yuqiong Liu and Rui Men and An Yang and Jingren Zhou and Junyang Lin",
        year=2025,
        arxiv_id="2507.18071",
    )
