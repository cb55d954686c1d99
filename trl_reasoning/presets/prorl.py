"""ProRL: prolonged RL with a KL term whose reference is hard-reset (Liu et al., NVIDIA, arXiv 2505.24864).

advantage ``grpo`` · objective ``clip`` with ``eps_low = 0.2, eps_high = 0.4`` (DAPO's clip-higher) · aggregation
``token_mean`` · dynamic sampling · rollout temperature 1.2 · 16 samples per prompt · ``beta = 1e-4`` (TRL's k3 KL
in the loss) · each rollout batch trained as 4 optimizer steps · constant learning rate · the reference (and the
optimizer's state) hard-reset to the current policy every 200 optimizer steps (``reference_reset_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.trainer_utils import SchedulerType

from ..config import OptimizerStepsPerGeneration, ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default

#: ProRL's training setup: a rollout batch of 256 prompts trained in mini-batches of 64, four updates per rollout.
PAPER_MINIBATCHES = 4


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class ProRLConfig(ReasoningConfig):
    """[`ReasoningConfig`] with ProRL's defaults: DAPO's recipe (`advantage_estimator="grpo"`, `policy_loss="clip"`
    with `epsilon=0.2`, `epsilon_high=0.4`, `loss_aggregation="token_mean"`, `dynamic_sampling=True`) with the KL
    term kept (`beta=1e-4`, TRL's k3 estimator in the loss), sampled at `temperature=1.2` with `num_generations=16`,
    each rollout batch trained as four optimizer steps (`steps_per_generation=4`), a constant learning rate, and the
    reference hard-reset every `reference_reset_steps=200` optimizer steps: the reference becomes a copy of the
    current policy and the optimizer's state is cleared (`trl_reasoning.trainer.reference_reset`; with LoRA the
    reference becomes the base model plus a frozen copy of the adapter).

    Where the paper is silent, or this preset differs from it:

    - **When to reset.** The paper resets by hand, between its training runs, when validation scores stall or fall;
      it gives no period and no KL threshold. The preset resets on a schedule instead: 200 steps is the low end of
      the 200-500 steps NVIDIA describes for ProRL v2. `reference_reset_kl` adds an automatic KL trigger (off by
      default: no threshold is published). A reset happens where a rollout batch ends, since its reference
      log-probs were computed when it was scored.
    - **The learning-rate schedule.** A reset clears the optimizer's moments and step counts but not the scheduler,
      which goes on with its schedule; with the preset's constant learning rate that changes nothing.
    - **The KL estimator.** TRL's `k3`, `exp(r) - r - 1` with `r = log pi_ref - log pi` (GRPO's, and verl's
      `low_var_kl` without its clamp to [-10, 10]), averaged over tokens with the policy loss (`token_mean`).
    - **Four updates per rollout.** TRL counts `steps_per_generation` in micro-batches; the preset's default counts
      optimizer steps, so with `gradient_accumulation_steps=g` it becomes `4 * g` micro-batches (a value you pass is
      TRL's micro-batches, as in `GRPOConfig`). A `generation_batch_size` you set replaces the preset's default (TRL
      refuses both).
    - **Not set here**: the learning rate (the paper's 2e-6 is for a 1.5B model), the context length (8k, then 16k),
      the batch of 256 prompts, the reward functions and their shaping across runs (the paper changed some between
      runs), and dynamic sampling's round cap (`max_num_gen_batches` keeps the package's 10, verl's DAPO value).
    - **Asynchronous rollouts** with `async_generator="process"` or `"server"` need one generation per optimizer
      step (`steps_per_generation` equal to `gradient_accumulation_steps`; the config refuses them otherwise); the
      reference is scored by the trainer's own forward either way.

    Paper: ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large Language Models,
    arXiv 2505.24864.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "grpo",
        source="ProRL §2.1 (GRPO, the algorithm ProRL prolongs: the group's rewards standardised)",
    )
    policy_loss: str | None = preset_default(
        "policy_loss",
        "clip",
        source="ProRL §2.2, 'Mitigating Entropy Collapse' (DAPO's decoupled clip, clip-higher)",
    )
    epsilon: float = preset_default("epsilon", 0.2, source="ProRL §2.2, 'Mitigating Entropy Collapse' (ε_low = 0.2)")
    epsilon_high: float | None = preset_default(
        "epsilon_high", 0.4, source="ProRL §2.2, 'Mitigating Entropy Collapse' (ε_high = 0.4)"
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "token_mean",
        source="ProRL §2.2 (DAPO's token-level policy-gradient loss; verl's `loss_agg_mode=token-mean`)",
    )
    dynamic_sampling: bool = preset_default(
        "dynamic_sampling",
        True,
        source="ProRL §2.2 (DAPO's dynamic sampling: prompts whose samples all score the same are filtered out)",
    )
    temperature: float = preset_default(
        "temperature", 1.2, source="ProRL §2.2, 'Mitigating Entropy Collapse' (rollout temperature 1.2)"
    )
    num_generations: int | None = preset_default(
        "num_generations", 16, source="ProRL's training setup (16 responses sampled per prompt)"
    )
    beta: float = preset_default(
        "beta",
        1e-4,
        source="ProRL §2.2, 'KL Regularization and Reference Policy Reset' (β·KL(π_θ‖π_ref) kept in the loss) and "
        "its training setup (β = 1e-4)",
    )
    steps_per_generation: int | None = preset_default(
        "steps_per_generation",
        OptimizerStepsPerGeneration(PAPER_MINIBATCHES),
        source="ProRL's training setup (a rollout batch of 256 prompts, mini-batches of 64: four updates per "
        "rollout). Counted in optimizer steps: `4 × gradient_accumulation_steps` micro-batches",
    )
    lr_scheduler_type: SchedulerType | str = preset_default(
        "lr_scheduler_type", "constant", source="ProRL's training setup (AdamW at a constant learning rate)"
    )
    reference_reset_steps: int | None = preset_default(
        "reference_reset_steps",
        200,
        source="ProRL §2.2, 'KL Regularization and Reference Policy Reset' (π_ref and the optimizer state reset to "
        "the current policy; the paper resets between runs, by hand); 200 steps: the low end of the 200-500 steps "
        "of NVIDIA's ProRL v2 post (developer.nvidia.com, Aug. 2025)",
    )


class ProRLTrainer(ReasoningTrainer):
    """ProRL on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`ProRLConfig`]."""

    config_class = ProRLConfig
    _name = "ProRL"
    _tag = "prorl"
    paper = Paper(
        key="liu2025prorl",
        title="ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large Language Models",
        authors="Mingjie Liu and Shizhe Diao and Ximing Lu and Jian Hu and Xin Dong and Yejin Choi and Jan Kautz and "
        "Yi Dong",
        year=2025,
        arxiv_id="2505.24864",
    )
