"""REINFORCE++: PPO's clip without a critic, the KL to the reference in each token's return, and advantages
normalised over the whole batch instead of per group (Hu et al., arXiv 2501.03262; OpenRLHF's ``reinforce`` and
``reinforce_baseline`` estimators).

advantage ``reinforce_pp_baseline`` (the group's mean reward subtracted, then each token's return
``r̃_i − β Σ_{s≥t} KL_is`` normalised over every completion token of the batch; ``reinforce_pp`` is the variant
without the group baseline) · objective ``clip`` 0.2 · aggregation ``token_mean`` · ``beta = 0.01`` with the k1 KL
in the per-token return (no KL term in the loss): OpenRLHF's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ReasoningConfig
from ..trainer.base import ReasoningTrainer
from .provenance import Paper, document_sources, preset_default


@document_sources
@dataclass(repr=False)  # ReasoningConfig's repr redacts tokens
class ReinforcePPConfig(ReasoningConfig):
    """[`ReasoningConfig`] with REINFORCE++'s defaults as OpenRLHF runs them: `advantage_estimator=
    "reinforce_pp_baseline"` (REINFORCE++-baseline, the authors' variant for reasoning with several samples per
    prompt), `policy_loss="clip"` with `epsilon=0.2`, `loss_aggregation="token_mean"` and `beta=0.01`, the KL coefficient
    of the per-token penalty `−β (log π_old − log π_ref)` that the estimator folds into each token's return (TRL's k3
    term is not added to the loss). `advantage_estimator="reinforce_pp"` is plain REINFORCE++ (no group baseline; the
    batch mean is the only one).

    The advantages are per token: `A_it = (G_it − mean) / sqrt(max(var, 1e-8))` with `G_it = r̃_i − β Σ_{s≥t} KL_is`,
    the mean and the biased variance taken over every counted completion token of the generation batch (all
    processes; only the groups that train when group selection drops some), as OpenRLHF's experience maker does.
    With `beta=0` every token of a completion shares `r̃_i`, and the normalisation weighs each completion by its
    length. `kl_in_reward=True` (the KL once more, per sequence) and `normalize_advantages=True` (a second, per
    completion normalisation) are refused with either estimator.

    Where the paper, OpenRLHF and this preset differ, or the paper is silent:

    - OpenRLHF's own reasoning script for `reinforce_baseline` (`examples/scripts/
      train_reinforce_baseline_hybrid_engine.sh`) moves the KL out of the return into the loss (`--algo.kl.use_loss
      --algo.kl.estimator k2`, coefficient 1e-5). The preset keeps the code's default, the k1 KL in the return with
      `--algo.kl.init_coef 0.01`; a KL term in the loss is not offered beside these estimators (it would count the KL
      twice). `beta=0` trains without any KL, as `--algo.kl.init_coef 0` does.
    - OpenRLHF clamps each token's log-ratio to [−10, 10] (`compute_approx_kl`), and so does the preset. It also
      clamps the (baseline-subtracted) reward to `--reward.clip_range`, (−10, 10) by default; here `reward_clip_range`
      is off by default and, when set, clamps the raw reward before any shaping.
    - Padding and tool-output tokens get advantage 0 (OpenRLHF leaves `(0 − mean) / std` there, which its loss masks
      out: the same loss). A completion no reward function could score (TRL's `None`, which OpenRLHF does not have) is
      left out of the statistics and gets 0.
    - The statistics run over one generation batch (TRL's `generation_batch_size`), OpenRLHF's over one rollout
      batch (`--rollout.batch_size` prompts × `--rollout.n_samples_per_prompt`). OpenRLHF's loss is a token mean per
      optimizer step (`--train.batch_size`); here `token_mean` over the generation batch, the same when each
      generation batch is one optimizer step (TRL's default).
    - OpenRLHF trains each rollout batch in several optimizer steps (its `reinforce_baseline` example script:
      192 prompts × 8 samples a rollout, updates of 192 samples, so eight per rollout), where the clip acts from
      the second one. The preset keeps TRL's one optimizer step per generation batch, where the ratio is 1 and the
      clip does not act; set `steps_per_generation` (micro-batches) to train each generation batch in several steps.
    - The return is undiscounted (γ = 1), OpenRLHF's default `--algo.advantage.gamma 1` (which it forces for
      `reinforce_baseline`); no other γ is offered.
    - The paper gives no group size; the preset keeps TRL's `num_generations=8` (OpenRLHF's reasoning script samples
      8 per prompt too).
    - The logged `loss` stays about 0 at every step, by construction and not for want of learning: at ratio 1 the
      loss is minus the token mean of the advantages, and the advantages are whitened over those same tokens (mean
      0). Its gradient is not 0 (`grad_norm` is about 1.5 on the main job's task); read the run in `reward`,
      `grad_norm`, `advantages/abs_mean` and `kl`, as for OpenRLHF's REINFORCE++ (whose `policy_loss` is ~0 too).

    Paper: REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Normalization, arXiv 2501.03262.
    """

    advantage_estimator: str | None = preset_default(
        "advantage_estimator",
        "reinforce_pp_baseline",
        source="REINFORCE++ (arXiv 2501.03262): REINFORCE++-baseline, the variant for reasoning with several samples "
        "per prompt; OpenRLHF `experience_maker.py` `--algo.advantage.estimator reinforce_baseline` (its README: the "
        "estimator for RLVR)",
    )
    policy_loss: str | None = preset_default(
        "policy_loss",
        "clip",
        source="REINFORCE++ (PPO's clipped surrogate on the token ratio); OpenRLHF `openrlhf/models/loss.py` "
        "`PolicyLoss` (`--actor.policy_loss_type ppo`, its default)",
    )
    epsilon: float = preset_default(
        "epsilon",
        0.2,
        source="OpenRLHF `openrlhf/cli/train_ppo_ray.py` `--actor.eps_clip` default 0.2, on both sides "
        "(`--actor.eps_clip_low_high` unset)",
    )
    loss_aggregation: str | None = preset_default(
        "loss_aggregation",
        "token_mean",
        source="OpenRLHF `openrlhf/models/loss.py` `aggregate_loss` with `token_level_loss=True` (`PolicyLoss`'s "
        "default): the masked sum over the batch's tokens divided by its token count",
    )
    beta: float = preset_default(
        "beta",
        0.01,
        source="OpenRLHF `train_ppo_ray.py` `--algo.kl.init_coef` default 0.01, the k1 KL (`--algo.kl.estimator k1`) "
        "in each token's reward (`--algo.kl.use_loss` off; `compute_reward`)",
    )


class ReinforcePPTrainer(ReasoningTrainer):
    """REINFORCE++ on TRL's GRPO machinery; takes `GRPOTrainer`'s arguments with a [`ReinforcePPConfig`]."""

    config_class = ReinforcePPConfig
    _name = "REINFORCE++"
    _tag = "reinforce-pp"
    paper = Paper(
        key="hu2025reinforce",
        title="REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Normalization",
        authors="Jian Hu and Jason Klein Liu and Haotian Xu and Wei Shen",
        year=2025,
        arxiv_id="2501.03262",
    )
