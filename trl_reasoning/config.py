"""``ReasoningConfig``: every field of TRL's ``GRPOConfig`` plus the fields that pick an algorithm's pieces by name.

Floor 3 of docs/architecture.md (imports TRL's config, never a trainer). A config resolves TRL's own loss settings
(``loss_type``, ``scale_rewards``) into this package's registries, validates every field at construction with a
message that names it, and records which values it derived (for the model card). ``preset_default`` re-declares a field with a preset's
default; ``trl_reasoning.trainer.base`` re-exports both.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments
from trl import GRPOConfig

from .algorithms.advantages import ADVANTAGE_ESTIMATORS
from .algorithms.aggregation import AGGREGATIONS
from .algorithms.anchors import resolve_anchor
from .algorithms.group_selection import GROUP_SELECTIONS, resolve_group_selection
from .algorithms.importance_sampling import ICEPOP_BAND, ICEPOP_MODE
from .algorithms.importance_sampling import check_mode as check_importance_sampling_mode
from .algorithms.losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
    async_anchor,
    base_objective,
    ratio_anchors,
    required_inputs,
    sequence_ratio_form,
)
from .algorithms.registry import Registry
from .algorithms.sampling_processors import unreproduced_settings
from .algorithms.shaping import MULTI_OBJECTIVE_AGGREGATIONS
from .algorithms.truncation import sampling_truncation
from .models.model_card import record_derived_values
from .rewards.wrapping import REWARD_ERROR_POLICIES
from .utils.typed_fields import coerce_field_types
from .utils.user_warnings import user_stacklevel

# TRL's `loss_type` = (objective, aggregation): a translation table of TRL's names, not a branch on ours.
# `importance_sampling_level="sequence"` takes the sequence ratio (GSPO's) in any objective that declares
# `sequence_level`; an objective with a registered sequence-ratio form (clip's is gspo) is spelled with that form.
_TRL_LOSS_TYPES = {
    "grpo": ("clip", "seq_mean_token_mean"),
    "dapo": ("clip", "token_mean"),
    "dr_grpo": ("clip", "seq_mean_token_sum_norm"),
    "cispo": ("cispo", "token_mean"),
    "bnpo": ("clip", "micro_batch_token_mean"),
    "sapo": ("sapo", "seq_mean_token_mean"),
    "luspo": ("clip", "seq_mean_token_sum"),
    "vespo": ("vespo", "token_mean"),
}
_TRL_LOSS_TYPE_OF = {pair: name for name, pair in _TRL_LOSS_TYPES.items()}
#: The objective and aggregation when neither they nor TRL's `loss_type` are set (a loss may declare its own
#: `default_aggregation`).
_DEFAULT_POLICY_LOSS, _DEFAULT_AGGREGATION = "clip", "token_mean"

# TRL's `scale_rewards` -> advantage estimator (the other way is each estimator's `trl_scale_rewards` trait).
_SCALE_REWARDS_TO_ESTIMATOR = {"group": "grpo", "batch": "batch", "none": "dr_grpo"}
_OVERLONG_AUTO_FRACTION = 0.2  # DAPO: L_cache = 4096 of L_max = 20480

#: The fields that choose a variant by name, and the registry each looks its name up in.
VARIANT_REGISTRIES: dict[str, Registry] = {
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "policy_loss": POLICY_LOSSES,
    "loss_aggregation": AGGREGATIONS,
    "group_selection": GROUP_SELECTIONS,
}
#: Every config field a registered variant declares, by name.
VARIANT_FIELDS = {
    name: declared for registry in VARIANT_REGISTRIES.values() for name, declared in registry.declared_fields().items()
}


def one_of_text(names) -> str:
    """``"one of a, b, c"``: the phrase every "one of" help text is built with (a test reads it back)."""
    return f"one of {', '.join(names)}"


def _variant_field(name: str):
    """The dataclass field of the variant field declared as ``name``: its default and help come from the
    declaration in the registry."""
    declared = VARIANT_FIELDS[name]
    return field(default=declared.default, metadata={"help": declared.help})


@dataclass(repr=False)  # keep TrainingArguments' repr, which redacts tokens (see __repr__)
class ReasoningConfig(GRPOConfig):
    r"""
    Configuration for [`ReasoningTrainer`] and every trl-reasoning preset: all of [`~trl.GRPOConfig`], plus the
    fields below that pick the algorithm's pieces by name. TRL's own fields keep their TRL meaning: a value that
    trl-reasoning cannot honour is rejected here, at construction, with a message naming the field.

    Parameters:
        > Parameters that choose the algorithm

        advantage_estimator (`str` or `None`, *optional*, defaults to `None`):
            A name registered in `trl_reasoning.algorithms.advantages.ADVANTAGE_ESTIMATORS` (`--help` and
            docs/configuration.md list them). `None` derives it from TRL's `scale_rewards` (`"group"` → `"grpo"`,
            `"batch"` → `"batch"`, `"none"` → `"dr_grpo"`), or, with `multi_objective_aggregation=
            "normalize_then_sum"`, takes TRL's batch standardisation (`"batch_zscore"`; TRL ignores `scale_rewards`
            there); when both are set they must agree.
        policy_loss (`str` or `None`, *optional*, defaults to `None`):
            A name registered in `trl_reasoning.algorithms.losses.POLICY_LOSSES` (`--help` and docs/configuration.md
            list them). `importance_sampling_level="sequence"` (TRL's field) gives the losses registered
            `sequence_level` one ratio per sequence, as in TRL; `"gspo"` is `"clip"` with it.
        loss_aggregation (`str` or `None`, *optional*, defaults to `None`):
            A name registered in `trl_reasoning.algorithms.aggregation.AGGREGATIONS` (`--help` and
            docs/configuration.md list them). With `policy_loss`,
            `None` derives both from TRL's `loss_type` (`"dapo"` when that is unset too); when both are set they must
            agree.
        loss_type (`str` or `None`, *optional*, defaults to `None`):
            TRL's loss name, accepted for drop-in compatibility: every TRL 1.16 value, `"grpo"`, `"dapo"`,
            `"dr_grpo"`, `"cispo"`, `"bnpo"`, `"sapo"`, `"luspo"`, `"vespo"`, each the same loss as in
            `GRPOTrainer`. `"bnpo"` normalizes per micro-batch (`"micro_batch_token_mean"`), so its gradient
            depends on how the batch is split (TRL's definition; a warning says so). After construction it holds the
            TRL name equivalent to `policy_loss` + `loss_aggregation`, or `None` if TRL has no equivalent (e.g. DPPO).
        scale_rewards (`str` or `None`, *optional*, defaults to `None`):
            TRL's reward scaling, accepted for drop-in compatibility (`"group"`, `"batch"`, `"none"`, or a bool).
            After construction it holds the value equivalent to `advantage_estimator`.
        kl_in_reward (`bool`, *optional*, defaults to `False`):
            Apply `beta` as a KL penalty in the reward (`r ← r − beta · Σ_t (log π_old − log π_ref)`, no gradient),
            as TRL's `RLOOTrainer` does, instead of TRL GRPO's per-token `beta · k3` term in the loss.
        normalize_advantages (`bool`, *optional*, defaults to `False`):
            Standardise the advantages over the generation batch (mean 0, std 1, over scored completions) after the
            estimator, as TRL's `RLOOConfig.normalize_advantages` does (any estimator here).

        > Parameters of reward shaping

        overlong_cache_length (`int`, `str` or `None`, *optional*, defaults to `None`):
            DAPO's soft overlong punishment: completions longer than `max_completion_length − overlong_cache_length`
            tokens get a penalty falling linearly to −1 at `max_completion_length`. `None` turns it off; `"auto"` uses
            20% of `max_completion_length` (the DAPO paper's 4096 of 20480).
        reward_clip_range (`tuple[float, float]` or `None`, *optional*, defaults to `None`):
            Clamp the weighted sum of the rewards to `(min, max)` before any other shaping (and before RLOO's KL
            penalty), as TRL's `RLOOConfig.reward_clip_range` does. `None`: no clipping.

        > Parameters of sampling

        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            DAPO's dynamic sampling (training only): groups whose task rewards (before shaping) are all equal are
            dropped, and fresh prompts from the training dataset are generated and scored until the generation
            batch holds `generation_batch_size / num_generations` informative groups, or `max_num_gen_batches`
            rounds have run. When rounds run out the step trains on the groups it has (the missing ones are filled
            with dropped groups whose loss weight is 0), with a warning and the `group_selection/round_cap_hit` metric.
        max_num_gen_batches (`int`, *optional*, defaults to `10`):
            The most generation rounds (the dataloader's batch included) dynamic sampling runs for one batch.
        extra_round_size (`str`, *optional*, defaults to `"keep_rate"`):
            How many prompts an extra dynamic-sampling round generates: `"keep_rate"` sizes it from the share of
            informative groups measured so far in the step (`ceil(missing / keep rate)` groups, whole rows on every
            process, at most a full batch; `algorithms.group_selection.extra_round_groups`); `"full"` generates a full generation batch
            every round, as verl's DAPO does. Which groups train follows the same rule either way.
        zero_variance_filtering (`bool`, *optional*, defaults to `False`):
            ScaleRL's zero-variance filtering: groups whose task rewards are all equal get loss weight 0 and the
            loss normalizers count only the other groups. Nothing is regenerated.
        group_selection (`str` or `None`, *optional*, defaults to `None`):
            The group-selection strategy by its name in `trl_reasoning.algorithms.group_selection.GROUP_SELECTIONS` (the
            built-in ones or one you registered). `None` follows the two switches above
            (`dynamic_sampling` → `"dynamic"`, `zero_variance_filtering` → `"zero_variance"`, else `"all"`); a name
            that contradicts a switch that is on is an error.
        positive_resampling_threshold (`float` or `None`, *optional*, defaults to `None`):
            ScaleRL's no-positive-resampling: a prompt whose group pass rate (share of completions that pass, see
            `task_pass_threshold`) reaches this threshold is not sampled again in later epochs (ScaleRL: 0.9). The
            retired prompts are saved in checkpoints. When every prompt is retired, training stops cleanly at the end
            of the epoch (a warning, a final checkpoint). `None` turns it off.
        task_pass_threshold (`float` or `None`, *optional*, defaults to `None`):
            When a completion counts as a pass for no-positive-resampling: task reward `>= task_pass_threshold`.
            `None` defines a pass only for a correctness reward, whose task rewards are all in {-1, 0, 1}: a pass is
            a task reward `> 0`. A task reward outside that set (a length reward, a judge's score in [0, 1]) then
            retires nothing, with a warning that names the reward functions and asks for this threshold (otherwise
            an always-positive reward would retire every prompt in the first epoch).
        task_reward_funcs (`list[str]` or `None`, *optional*, defaults to `None`):
            The reward functions, by name (as logged under `rewards/<name>`), whose weighted sum is the *task* reward:
            what dynamic sampling and zero-variance filtering call informative and what no-positive-resampling calls
            a pass (see `task_pass_threshold`). Auxiliary rewards (format, length) and overlong shaping still shape the
            advantage but never decide these. `None` takes every reward function, except that no-positive-resampling
            with several reward functions needs it set (a format bonus alone must never retire a prompt the model
            never solved). Logged as `task_reward`.

        > Parameters of asynchronous rollouts

        async_rollouts (`bool` or `None`, *optional*, defaults to `False`):
            Train on rollouts sampled by an earlier policy, with a deterministic staleness bound (PipelineRL-k, as
            ScaleRL trains): the batch of generation step `g` is sampled from the weights of step `g − max_staleness`
            (the first ones from the initial weights), whatever the timing, so a run is reproducible and resumes
            exactly (the behaviour weights are saved in checkpoints). The sampled tokens' log-probabilities under
            that behaviour policy `μ` are recorded at generation time, and TRL's own importance-sampling correction
            between `π_old` and `μ` applies (`vllm_importance_sampling_*`, as for vLLM); losses whose ratio is
            defined against the sampler take `μ` directly (DPPO's ratio and mask, CISPO's capped weight). Works with
            HF `generate` and with vLLM (the engine is synced with the behaviour weights). Where the batches are
            sampled is `async_generator`'s choice (in the training process by default: the lag without an overlap).
            Logged: `async/staleness`, TRL's `sampling/importance_sampling_ratio/*` and `async/is_weight_changed`
            (losses that use TRL's correction), `async/sampler_ratio/{mean,abs_log_mean}` (CISPO, DPPO: `π_θ / μ`).
            `None` (ScaleRL's default): on wherever the run supports it, synchronous with a warning where it does not
            (a vision-language model sampled by `generate`, whose sampler log-probabilities are not recorded; FSDP or
            DeepSpeed ZeRO-3, whose processes hold only shards of the weights to snapshot). `True` refuses those runs
            with an error.
        max_staleness (`int`, *optional*, defaults to `1`):
            `k`, the staleness bound in generation steps (optimizer steps when `steps_per_generation` equals
            `gradient_accumulation_steps`, TRL's default). `0` samples from the current weights.
        async_generator (`str`, *optional*, defaults to `"inline"`):
            Where asynchronous batches are sampled. `"inline"`: in the training process, when the batch is needed
            (the same lag, no overlap in time). `"process"`: in a worker process with its own copy of the model
            (HF `generate`), which samples the next `k` batches while the trainer trains; each call is seeded, so
            both generators give the same batches. `"process"` needs `max_staleness >= 1`, one generation per
            optimizer step (`steps_per_generation * num_iterations == gradient_accumulation_steps`, TRL's default),
            no vLLM (vLLM is its own engine), no tools, a text model and no bitsandbytes quantization. `"server"`:
            TRL's vLLM server (`use_vllm=True, vllm_mode="server"`) samples the next `k` batches while the trainer
            trains: each batch's behaviour weights are pushed with TRL's weight sync as soon as they exist and its
            prompts sent with TRL's client from a background thread (the server's own sampling seeds; needs
            `max_staleness >= 1`, one generation per optimizer step, no tools and a text model).
        async_timeout (`float`, *optional*, defaults to `600.0`):
            `"process"` and `"server"`: seconds the trainer waits for a batch before a `GeneratorError` (`"server"`:
            for each request, counted from its sending, so a queue of slow healthy requests never fails); a worker
            that dies is reported within a second.
        ratio_anchor (`str` or `None`, *optional*, defaults to `None`):
            What the objective's importance ratio is taken against (`trl_reasoning.algorithms.anchors`). `"pi_old"`:
            `π_θ / π_old` with TRL's correction `π_old / μ` on top (`GRPOTrainer`'s objective; with one optimizer step
            per generation batch the ratio is 1 and the clip never acts). `"sampler"`: `π_θ / μ`, the ratio to the
            policy that sampled, with no separate correction (verl's "bypass mode", the DPPO paper's GRPO baseline).
            `"decoupled"`: AReaL's decoupled objective, the clip on `π_θ / π_prox` times `min(π_prox / μ, C)` per token
            (TRL's correction in `"token_truncate"` mode, `C = vllm_importance_sampling_clip_max`). `None`: `"pi_old"`
            on a synchronous run (TRL's objective, so a swap from `GRPOTrainer` trains as before), the objective's
            declared asynchronous anchor on an asynchronous one (`"decoupled"` for the clip, GSPO, RLOO's sequence
            clip and SAPO, unless the correction was turned off or given another mode; `"sampler"` for CISPO and
            DPPO, whose ratio and mask are the sampler's; `"pi_old"` for VESPO, whose weight folds in `π_old / μ`).
            Resolved at construction where `async_rollouts` is `True` or `False`, by the trainer where it is `None`.
        importance_sampling_pi_old_from_loss (`bool`, *optional*, defaults to `True`):
            Where `π_old` of the importance-sampling correction between `π_old` and the sampler `μ` (vLLM or
            asynchronous rollouts, `vllm_importance_sampling_*`) comes from. `True`: from the loss's own forward
            (its detached log-probs) wherever that is exact, that is when `gradient_accumulation_steps` is a multiple
            of `steps_per_generation * num_iterations` (each generation batch is scored and trained within one
            optimizer step: TRL's default); TRL's separate no-grad forward over the batch is skipped and its
            `sampling/*` metrics are computed in the loss, with the same values. Elsewhere TRL's forward stays.
            `False`: TRL's forward at scoring, as `GRPOTrainer` does. `vllm_importance_sampling_mode` also takes
            `"sequence_geo_truncate"` and `"sequence_geo_mask"` (the geometric mean of the token ratios: Geo-RS) and
            `"token_icepop"` (IcePop's band mask: `vllm_importance_sampling_clip_min/max` left at TRL's defaults, `None`
            and `3.0`, become IcePop's band `[0.5, 5]`); see `trl_reasoning.algorithms.importance_sampling`. Logged:
            `sampling/effective_sample_size`.
        truncated_support_scoring (`bool` or `None`, *optional*, defaults to `None`):
            With truncated sampling (`top_k > 0`, `top_p < 1` or `min_p`, also through `generation_kwargs`) the
            sampler's log-probs are those of the truncated, renormalised distribution, while TRL scores the policy on
            the whole vocabulary, so their ratio is not 1 even on-policy. `True`: the policy (and `pi_old` and the
            reference, wherever TRL scores them) is scored on the same support, the temperature and the truncation
            applied to its own logits and renormalised, so the ratio is exactly 1 at lag 0. `False`: TRL's
            full-vocabulary scoring. `None`: on when sampling truncates and the sampler's log-probs enter the loss
            (`use_vllm=True` or asynchronous rollouts), except with DPPO's top-K divergence or the entropy bonus (off
            there, with a warning); a synchronous run sampled by `generate` keeps TRL's objective unless `True`. The
            repetition penalty is not reproduced.

        > Parameters of fault handling

        on_reward_error (`str`, *optional*, defaults to `"raise"`):
            What happens when a reward function raises. `"raise"`: an error naming the function, the failing sample
            and the exception. `"exclude"`: the samples it fails on (found by calling it again sample by sample) get
            no reward (advantage 0, like a `None` reward) and are counted in `rewards/<name>/errors`.
        reward_timeout (`float` or `None`, *optional*, defaults to `None`):
            Seconds one call of a reward function may take. Past it the call counts as an error under
            `on_reward_error`: `"raise"` stops with an error naming the function and the timeout; `"exclude"` gives
            every sample of that call no reward (counted in `rewards/<name>/errors`; the samples are not retried one
            by one, which could cost a timeout each). The call runs in a helper thread (an async reward function:
            under `asyncio.wait_for`), so a stuck judge cannot stall the run; a thread that never returns is left
            running in the background. `None`: no limit, as in TRL.
        filter_overlong_prompts (`bool`, *optional*, defaults to `True`):
            Prompts whose tokens plus `max_completion_length` exceed the model's context (`max_position_embeddings`)
            are removed from the training and evaluation datasets when the trainer is built, with a warning naming
            each one (index and length in tokens); from a streaming dataset they are skipped as they are read, with
            the same warning. Past the context every log-probability is computed at positions the model never saw.
            `False`: such a prompt is an error at construction that names it.
        nonfinite_loss_patience (`int`, *optional*, defaults to `3`):
            An optimizer step whose loss is NaN or infinite is skipped (parameters and optimizer state untouched),
            counted in `nonfinite_loss/skipped_steps` and warned about; more than this many consecutive skipped steps
            stop training with a `NonFiniteLossError`. `0` stops at the first one.

        > Parameters of the reference reset

        reference_reset_steps (`int` or `None`, *optional*, defaults to `None`):
            ProRL's hard reset: every this many optimizer steps the KL reference becomes a copy of the current policy
            and the optimizer's state (AdamW's moments and step counts) is cleared; the learning-rate schedule goes on.
            A reset happens where a rollout batch ends (its reference log-probs were computed when it was scored), at
            the first such boundary once the steps have passed. With LoRA the reference becomes the base model plus a
            frozen copy of the adapter (TRL's `"ref"` adapter). Saved in checkpoints; logged as `reference/resets` and
            `reference/last_reset_step`. Needs `beta != 0`; not with `sync_ref_model`, DeepSpeed or FSDP. `None`: no
            scheduled reset (docs/prorl.md).
        reference_reset_kl (`float` or `None`, *optional*, defaults to `None`):
            Also reset (as above) at the end of a rollout batch whose mean KL to the reference (the logged `kl`,
            averaged over its micro-batches) exceeds this value. Needs the KL in the loss (`beta != 0`,
            `kl_in_reward=False`, and not REINFORCE++'s estimators, which put it in each token's return). `None`: no
            KL trigger.

        > Parameters of DPPO

        dppo_divergence (`str`, *optional*, defaults to `"binary_tv"`):
            The divergence of DPPO's trust-region mask: `"binary_tv"` or `"binary_kl"` (the sampled token against
            the rest), or `"topk_tv"` / `"topk_kl"` (the rollout distribution's top-`dppo_topk` tokens plus a rest
            bucket; the rollout's top-K ids and log-probs are stored at generation time).
        dppo_topk (`int`, *optional*, defaults to `20`):
            K of the `"topk_*"` divergences.
        dppo_threshold (`float` or `None`, *optional*, defaults to `None`):
            The mask's threshold δ; `None` takes the paper's default for the divergence (0.15 TV, 0.05 KL).
        dppo_is_cap (`float` or `None`, *optional*, defaults to `None`):
            Optional cap `C` on DPPO's importance ratio `π / μ_rollout` (`w = min(π / μ_rollout, C)`). `None`, the
            authors' setting, applies no cap (their verl script sets `clip_ratio_c=10000` "for a fair comparison").

        > Parameters of MaxRL

        maxrl_reward_threshold (`float` or `None`, *optional*, defaults to `None`):
            MaxRL needs binary rewards. With a threshold, a reward `≥` threshold counts as a success (1), otherwise a
            failure (0). Without one, non-binary rewards raise an error naming the reward function.
    """

    advantage_estimator: str | None = field(
        default=None,
        metadata={
            "help": f"Advantage estimator: {one_of_text(ADVANTAGE_ESTIMATORS.names())}. None derives it from `scale_rewards`.",
        },
    )
    policy_loss: str | None = field(
        default=None,
        metadata={
            "help": f"Per-token policy objective: {one_of_text(POLICY_LOSSES.names())}. None derives it from `loss_type`.",
        },
    )
    loss_aggregation: str | None = field(
        default=None,
        metadata={
            "help": f"Loss aggregation: {one_of_text(AGGREGATIONS.names())}. None derives it from `loss_type`.",
        },
    )
    loss_type: str | None = field(
        default=None,
        metadata={
            "help": f"TRL's loss name ({one_of_text(_TRL_LOSS_TYPES)}), accepted for drop-in compatibility; must agree "
            "with `policy_loss`/`loss_aggregation` when those are set.",
        },
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": f"TRL's reward scaling ({one_of_text(_SCALE_REWARDS_TO_ESTIMATOR)}; or a bool), accepted for drop-in "
            "compatibility; must agree with `advantage_estimator` when that is set.",
        },
    )
    kl_in_reward: bool = field(
        default=False,
        metadata={
            "help": "Apply `beta` as a sequence-level KL penalty in the reward (TRL's RLOO) instead of the loss."
        },
    )
    overlong_cache_length: int | str | None = field(
        default=None,
        metadata={
            "help": "DAPO overlong shaping: the length of the penalty ramp before max_completion_length, in tokens. "
            "None = off; 'auto' = 20% of max_completion_length.",
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: drop groups with all-equal rewards and generate for fresh prompts until "
            "the batch is full of informative groups (at most `max_num_gen_batches` rounds)."
        },
    )
    max_num_gen_batches: int = _variant_field("max_num_gen_batches")
    extra_round_size: str = _variant_field("extra_round_size")
    zero_variance_filtering: bool = field(
        default=False,
        metadata={"help": "ScaleRL: give groups with all-equal rewards loss weight 0 (without generating more)."},
    )
    group_selection: str | None = field(
        default=None,
        metadata={
            "help": f"Group-selection strategy by registered name: {one_of_text(GROUP_SELECTIONS.names())} (or your own). "
            "None = follow dynamic_sampling / zero_variance_filtering."
        },
    )
    positive_resampling_threshold: float | None = field(
        default=None,
        metadata={
            "help": "ScaleRL no-positive-resampling: prompts whose group pass rate reaches this threshold are not "
            "sampled in later epochs. None = off."
        },
    )
    task_reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "The reward functions (by name) whose weighted sum is the task reward that dynamic sampling, "
            "zero-variance filtering and no-positive-resampling judge. None = all of them."
        },
    )
    async_rollouts: bool | None = field(
        default=False,
        metadata={
            "help": "Sample each batch from the policy of max_staleness generation steps earlier (deterministic "
            "PipelineRL-k), with TRL's importance-sampling correction against it. None = on where the run supports it."
        },
    )
    max_staleness: int = field(
        default=1,
        metadata={"help": "Asynchronous rollouts: the staleness bound k in generation steps (0 = current weights)."},
    )
    async_generator: str = field(
        default="inline",
        metadata={
            "help": "Asynchronous rollouts: 'inline' (in the training process), 'process' (a worker process that "
            "samples the next max_staleness batches while the trainer trains) or 'server' (TRL's vLLM server, sent "
            "the next batches ahead)."
        },
    )
    async_timeout: float = field(
        default=600.0,
        metadata={
            "help": "Asynchronous rollouts with async_generator='process' or 'server': seconds to wait for a batch."
        },
    )
    ratio_anchor: str | None = field(
        default=None,
        metadata={
            "help": "What the objective's ratio is taken against: 'pi_old' (TRL's, with its correction pi_old / mu), "
            "'sampler' (pi / mu, the policy that sampled: verl's bypass mode) or 'decoupled' (AReaL: clip on "
            "pi / pi_prox, weight min(pi_prox / mu, C)). None = 'pi_old' when synchronous, the objective's declared "
            "anchor with async_rollouts ('decoupled' for the clip, 'sampler' for CISPO and DPPO)."
        },
    )
    importance_sampling_pi_old_from_loss: bool = field(
        default=True,
        metadata={
            "help": "Take pi_old of the vLLM/asynchronous importance-sampling correction from the loss's own forward "
            "where exact (gradient_accumulation_steps a multiple of steps_per_generation * num_iterations), skipping "
            "TRL's extra no-grad forward. False = TRL's forward at scoring."
        },
    )
    truncated_support_scoring: bool | None = field(
        default=None,
        metadata={
            "help": "Score the policy (and pi_old, the reference) on the sampler's truncated support (top_k, top_p, "
            "min_p applied to its own logits, renormalised), so that its ratio to the sampler's log-probs is 1 "
            "on-policy. False = TRL's full-vocabulary scoring. None = on when sampling truncates with vLLM or "
            "asynchronous rollouts (off, with a warning, with DPPO's top-K divergence or the entropy bonus)."
        },
    )
    on_reward_error: str = field(
        default="raise",
        metadata={
            "help": "When a reward function raises: 'raise' (error naming it and the sample) or 'exclude' (those "
            "samples get no reward and are counted in rewards/<name>/errors)."
        },
    )
    nonfinite_loss_patience: int = field(
        default=3,
        metadata={
            "help": "Steps with a NaN/inf loss are skipped (parameters untouched); more than this many in a row stop "
            "training with an error."
        },
    )
    dppo_divergence: str = _variant_field("dppo_divergence")
    dppo_topk: int = _variant_field("dppo_topk")
    dppo_threshold: float | None = _variant_field("dppo_threshold")
    dppo_is_cap: float | None = _variant_field("dppo_is_cap")
    maxrl_reward_threshold: float | None = _variant_field("maxrl_reward_threshold")
    normalize_advantages: bool = field(
        default=False,
        metadata={
            "help": "Standardise the advantages over the generation batch after the estimator (TRL's "
            "RLOOConfig.normalize_advantages)."
        },
    )
    reward_clip_range: tuple[float, float] | None = field(
        default=None,
        metadata={"help": "Clip range for rewards as (min, max). If None, no clipping is applied."},
    )
    task_pass_threshold: float | None = field(
        default=None,
        metadata={
            "help": "No-positive-resampling: a completion passes when its task reward is >= this. None = a task "
            "reward in {-1, 0, 1} passes when > 0 (another reward then retires nothing, with a warning)."
        },
    )
    reward_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a reward function call may take; past it the call is an error under on_reward_error. "
            "None = no limit."
        },
    )
    filter_overlong_prompts: bool = field(
        default=True,
        metadata={
            "help": "Remove (with a warning naming them) prompts that cannot fit the model's context with "
            "max_completion_length; False = an error at construction."
        },
    )
    reference_reset_steps: int | None = field(
        default=None,
        metadata={
            "help": "ProRL's reference reset: every this many optimizer steps (at the end of a rollout batch) the KL "
            "reference becomes the current policy and the optimizer's state is cleared. None = no scheduled reset. "
            "Needs beta != 0."
        },
    )
    reference_reset_kl: float | None = field(
        default=None,
        metadata={
            "help": "Also reset the reference (and the optimizer's state) after a rollout batch whose mean KL to it "
            "exceeds this value. None = no KL trigger. Needs beta != 0 and kl_in_reward=False."
        },
    )

    def __post_init__(self):
        # A value given in Python gets the conversion TRL's YAML/CLI parsing applies (never a truthy "false").
        coerce_field_types(self)
        passed = {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.init}
        self._resolve_loss()
        self._resolve_advantage_estimator()
        self._validate_reasoning_fields()
        self._resolve_truncated_support_scoring()
        try:
            super().__post_init__()
        except ValueError as error:
            explained = self._preset_group_size_error(error)
            if explained is error:
                raise
            raise explained from error
        # The model card tells what the user set from what __post_init__ derived, without building a config later
        # (building one mid-training resets accelerate's global state).
        record_derived_values(self, passed)

    def _preset_group_size_error(self, error: ValueError) -> ValueError:
        """TRL's "must be divisible by num_generations" names a group size the user may never have set: a preset's
        own (ProRL's 16). Say so, and the ways out; any other error unchanged."""
        field_default = {f.name: f.default for f in dataclasses.fields(self)}["num_generations"]
        trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}["num_generations"]
        if "divisible by num_generations" not in str(error) or field_default == trl_default:
            return error
        if self.num_generations != field_default:
            return error
        return ValueError(
            f"{error} num_generations={field_default} is {type(self).__name__}'s default (GRPOConfig's is "
            f"{trl_default}): make per_device_train_batch_size x steps_per_generation (or generation_batch_size) a "
            f"multiple of {field_default}, or set num_generations."
        )

    # Secrets (`hub_token`, ...) never leave the process: the repr and pickles (`training_args.bin`, written by the
    # Trainer next to every checkpoint) replace them with a placeholder; in-process copies keep them.
    def __repr__(self) -> str:
        return TrainingArguments.__str__(self)

    def __getstate__(self) -> dict[str, Any]:
        return {
            key: f"<{key.upper()}>" if key.endswith("_token") and isinstance(value, str) else value
            for key, value in self.__dict__.items()
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __copy__(self):
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo):
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone

    def _resolve_loss(self) -> None:
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"Unknown importance_sampling_level {self.importance_sampling_level!r}. Allowed values: "
                f"{', '.join(IMPORTANCE_SAMPLING_LEVELS)}."
            )
        sequence_level = self.importance_sampling_level == "sequence"
        if self.loss_type is not None:
            self._resolve_trl_loss_type(sequence_level)
        else:
            if self.policy_loss is None:
                default = _DEFAULT_POLICY_LOSS
                self.policy_loss = sequence_ratio_form(default) if sequence_level else default
            if self.loss_aggregation is None:
                self.loss_aggregation = POLICY_LOSSES.trait(
                    self.policy_loss, "default_aggregation", _DEFAULT_AGGREGATION
                )
        POLICY_LOSSES.get(self.policy_loss)  # raises on an unknown name, listing the allowed ones
        AGGREGATIONS.get(self.loss_aggregation)
        self._resolve_importance_sampling_level(sequence_level)
        # The TRL name of the result, which TRL's own __init__ reads for its warnings (None: TRL has no equivalent).
        self.loss_type = _TRL_LOSS_TYPE_OF.get((base_objective(self.policy_loss), self.loss_aggregation))
        if AGGREGATIONS.trait(self.loss_aggregation, "per_micro_batch", False):
            warnings.warn(
                f"loss_aggregation={self.loss_aggregation!r} (TRL's loss_type='bnpo') normalizes by the tokens of each "
                "process's micro-batch, as TRL defines it: the gradient of an optimizer step then depends on "
                "per_device_train_batch_size, the number of processes and gradient accumulation, not only on the "
                "batch. loss_type='dapo' (loss_aggregation='token_mean') normalizes by the tokens of the whole batch.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )

    def _resolve_trl_loss_type(self, sequence_level: bool) -> None:
        """``policy_loss`` and ``loss_aggregation`` from TRL's ``loss_type``; a value set that means another loss is
        an error naming both fields."""
        if self.loss_type not in _TRL_LOSS_TYPES:
            raise ValueError(
                f"Unknown loss_type {self.loss_type!r}. Allowed values: {', '.join(_TRL_LOSS_TYPES)}, or None."
            )
        implied_loss, implied_aggregation = _TRL_LOSS_TYPES[self.loss_type]
        if sequence_level:
            implied_loss = sequence_ratio_form(implied_loss)  # TRL's clip with the sequence ratio is gspo
        for name, value, implied in (
            ("policy_loss", self.policy_loss, implied_loss),
            ("loss_aggregation", self.loss_aggregation, implied_aggregation),
        ):
            # a loss and its sequence-ratio form agree (importance_sampling_level is checked separately)
            same_objective = (
                name == "policy_loss" and value in POLICY_LOSSES and base_objective(value) == base_objective(implied)
            )
            if value is not None and value != implied and not same_objective:
                raise ValueError(
                    f"{name}={value!r} conflicts with loss_type={self.loss_type!r}, which means "
                    f"policy_loss={implied_loss!r} and loss_aggregation={implied_aggregation!r} in TRL. Set "
                    f"loss_type=None to use {name}={value!r}, or drop {name}."
                )
        self.policy_loss = implied_loss if self.policy_loss is None else self.policy_loss
        self.loss_aggregation = implied_aggregation

    def _resolve_importance_sampling_level(self, sequence_level: bool) -> None:
        """A loss that is another's sequence-ratio form (gspo) sets ``importance_sampling_level="sequence"``; with
        ``"sequence"``, the loss must declare ``sequence_level``."""
        if POLICY_LOSSES.trait(self.policy_loss, "sequence_ratio_of"):
            self.importance_sampling_level = "sequence"  # its ratio is the sequence ratio by definition
        elif sequence_level and not POLICY_LOSSES.trait(self.policy_loss, "sequence_level", False):
            allowed = POLICY_LOSSES.with_trait("sequence_level")
            forms = POLICY_LOSSES.with_trait("sequence_ratio_of")
            raise ValueError(
                f"importance_sampling_level='sequence' takes one importance ratio per sequence, which policy_loss="
                f"{self.policy_loss!r} does not define (it is honoured by {', '.join(allowed)} and "
                f"{', '.join(forms)}). Use importance_sampling_level='token'."
            )

    def _resolve_advantage_estimator(self) -> None:
        scale = self.scale_rewards
        if isinstance(scale, bool):
            scale = "group" if scale else "none"
        if scale is not None and scale not in _SCALE_REWARDS_TO_ESTIMATOR:
            raise ValueError(
                f"Unknown scale_rewards {self.scale_rewards!r}. Allowed values: "
                f"{', '.join(_SCALE_REWARDS_TO_ESTIMATOR)}, True, False or None."
            )
        if self.advantage_estimator is None and self.multi_objective_aggregation == "normalize_then_sum":
            # TRL's normalize_then_sum ends in a batch standardisation and ignores scale_rewards; so does this.
            self.advantage_estimator, scale = "batch_zscore", None
        if self.advantage_estimator is None:
            self.advantage_estimator = _SCALE_REWARDS_TO_ESTIMATOR[scale or "group"]
        ADVANTAGE_ESTIMATORS.get(self.advantage_estimator)
        implied = ADVANTAGE_ESTIMATORS.trait(self.advantage_estimator, "trl_scale_rewards", "none")
        if scale is not None and scale != implied:
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} conflicts with advantage_estimator="
                f"{self.advantage_estimator!r}, whose scaling is TRL's scale_rewards={implied!r}. Drop scale_rewards, "
                f"or choose the estimator that matches it ({_SCALE_REWARDS_TO_ESTIMATOR[scale]!r})."
            )
        self.scale_rewards = implied

    def _resolve_truncated_support_scoring(self) -> None:
        """``truncated_support_scoring``: checked, and ``None`` resolved (on when sampling truncates and the sampler's
        log-probs enter the loss, with vLLM or asynchronous rollouts, where the loss path supports it)."""
        requested = self.truncated_support_scoring
        if requested is not None and not isinstance(requested, bool):
            raise ValueError(f"truncated_support_scoring must be True, False or None, got {requested!r}.")
        truncation = sampling_truncation(self.top_k, self.top_p, self.min_p, self.generation_kwargs)
        unsupported = []
        if "rollout_topk_logps" in required_inputs(self.policy_loss, divergence=self.dppo_divergence):
            unsupported.append(f"dppo_divergence={self.dppo_divergence!r} (its top-K ids may lie outside the support)")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            unsupported.append("the entropy bonus (the truncated entropy carries no gradient)")
        if requested is True and not truncation.truncates:
            raise ValueError(
                "truncated_support_scoring=True, but sampling does not truncate (top_k=0, top_p=1, no min_p): there "
                "is no truncated support. Set it to None or False."
            )
        if requested is True and unsupported:
            raise ValueError(
                f"truncated_support_scoring=True does not support {'; '.join(unsupported)}. Set "
                "truncated_support_scoring=False (TRL's full-vocabulary scoring)."
            )
        # Only where the sampler's log-probs meet the policy's in a ratio (vLLM, asynchronous rollouts) is TRL's
        # full-vocabulary scoring a bias of that ratio; a synchronous run sampled by `generate` keeps TRL's objective.
        ratio_to_sampler = self.use_vllm or self.async_rollouts is not False
        if requested is None:
            self.truncated_support_scoring = truncation.truncates and ratio_to_sampler and not unsupported
            if truncation.truncates and ratio_to_sampler and unsupported:
                warnings.warn(
                    f"Sampling truncates ({truncation}), but the policy is scored on the whole vocabulary, as TRL "
                    f"does, because of {'; '.join(unsupported)}: the importance-sampling ratio is not 1 on-policy. "
                    "Set truncated_support_scoring=False to silence this warning.",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )

    def _validate_reasoning_fields(self) -> None:
        """Every trl-reasoning field, each error naming it; the chosen variants' own fields and checks are declared in
        their registries (``VARIANT_REGISTRIES``)."""
        if self.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
            raise ValueError(
                f"Unknown multi_objective_aggregation {self.multi_objective_aggregation!r}. Allowed values: "
                f"{', '.join(MULTI_OBJECTIVE_AGGREGATIONS)}."
            )
        if (
            ADVANTAGE_ESTIMATORS.trait(self.advantage_estimator, "group_relative", False)
            and (self.num_generations or 0) < 2
        ):
            raise ValueError(
                f"num_generations={self.num_generations} is too small: advantage_estimator="
                f"{self.advantage_estimator!r} compares each completion with the others of its prompt's group, so "
                "num_generations must be >= 2."
            )
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}.")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise ValueError(f"epsilon_high must be > 0 (or None to use epsilon), got {self.epsilon_high}.")
        self._validate_delta()
        self._validate_reward_clip_range()
        self._validate_async_fields()
        self._resolve_icepop_band()
        self._resolve_ratio_anchor()
        self._validate_reward_fields()
        self._validate_ordering()
        self._resolve_overlong_cache_length()
        self._validate_reference_reset()
        self._validate_variants()

    def _validate_reference_reset(self) -> None:
        """``reference_reset_steps`` and ``reference_reset_kl``: their values, and a reference to reset (``beta != 0``,
        not TRL's own ``sync_ref_model``; the KL trigger reads the loss's KL)."""
        steps, kl = self.reference_reset_steps, self.reference_reset_kl
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(
                f"reference_reset_steps must be a positive integer (optimizer steps) or None, got {steps!r}."
            )
        if kl is not None and (isinstance(kl, bool) or not isinstance(kl, (int, float)) or not 0 < kl < math.inf):
            raise ValueError(f"reference_reset_kl must be a positive finite number or None, got {kl!r}.")
        if steps is None and kl is None:
            return
        chosen = f"reference_reset_steps={steps}, reference_reset_kl={kl}"
        if self.beta == 0.0:
            raise ValueError(
                f"{chosen} resets the KL reference, but beta=0.0 trains without one (TRL builds no reference). Set "
                "beta > 0, or reference_reset_steps=None and reference_reset_kl=None."
            )
        if self.sync_ref_model:
            raise ValueError(
                f"{chosen} hard-resets the reference, which sync_ref_model=True also moves (TRL's soft mix every "
                "ref_model_sync_steps). Choose one: sync_ref_model=False, or both reset fields None."
            )
        if kl is not None and self.kl_in_reward:
            raise ValueError(
                f"reference_reset_kl={kl} reads the KL of the loss, which kl_in_reward=True moves into the reward. "
                "Set kl_in_reward=False, or reference_reset_kl=None (reference_reset_steps works with either)."
            )
        if kl is not None and ADVANTAGE_ESTIMATORS.trait(self.advantage_estimator, "kl_in_return", False):
            raise ValueError(
                f"reference_reset_kl={kl} reads the KL of the loss, which advantage_estimator="
                f"{self.advantage_estimator!r} puts in each token's return instead. Set reference_reset_kl=None "
                "(reference_reset_steps works with it)."
            )

    def _validate_delta(self) -> None:
        """``delta`` (two-sided clipping) applies to the losses that take it; TRL runs some losses without it (they
        declare ``ignores_delta``): there it is accepted and ignored, with a warning."""
        if self.delta is None or POLICY_LOSSES.takes(self.policy_loss, "delta"):
            return
        if POLICY_LOSSES.trait(self.policy_loss, "ignores_delta", False):
            warnings.warn(
                f"delta={self.delta} (two-sided clipping of the clip objective) is ignored by policy_loss="
                f"{self.policy_loss!r}, as TRL ignores it for loss_type={self.policy_loss!r}.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return
        takers = [name for name in POLICY_LOSSES.names() if POLICY_LOSSES.takes(name, "delta")]
        forms = [name for name in takers if POLICY_LOSSES.trait(name, "sequence_ratio_of")]
        objectives = " or ".join(repr(name) for name in takers if name not in forms)
        also = f" (and {', '.join(repr(name) for name in forms)})" if forms else ""
        own = ", ".join(declared.name for declared in POLICY_LOSSES.fields(self.policy_loss))
        raise ValueError(
            f"delta={self.delta} (two-sided clipping) applies to policy_loss={objectives}{also} only, not "
            f"{self.policy_loss!r}{f' (its own fields: {own})' if own else ''}. Set delta=None."
        )

    def _validate_variants(self) -> None:
        """The fields every registered variant declares (whichever is chosen), then the checks of the chosen ones."""
        chosen = {name: getattr(self, name) for name in VARIANT_REGISTRIES}
        chosen["group_selection"] = resolve_group_selection(self)  # raises on an unknown or contradicting name
        for name, registry in VARIANT_REGISTRIES.items():
            registry.check_fields(self)
            registry.check_config(chosen[name], self)

    def _validate_async_fields(self) -> None:
        """Asynchronous rollouts and the importance-sampling correction."""
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {self.max_staleness!r}.")
        if self.async_generator not in ("inline", "process", "server"):
            raise ValueError(f"async_generator must be 'inline', 'process' or 'server', got {self.async_generator!r}.")
        check_importance_sampling_mode(self.vllm_importance_sampling_mode)
        if (
            self.vllm_importance_sampling_mode == "sequence_geo_truncate"  # TRL checks its own truncating modes
            and self.vllm_importance_sampling_clip_min is None
            and self.vllm_importance_sampling_clip_max is None
        ):
            raise ValueError(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r} truncates the importance "
                "weights: set vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max."
            )
        if self.async_rollouts is True:
            settings = {"repetition_penalty": self.repetition_penalty, **(self.generation_kwargs or {})}
            found = unreproduced_settings(settings, "vllm" if self.use_vllm else "generate")
            if found:
                raise ValueError(
                    f"async_rollouts=True trains on the ratio of the policy to the sampler's recorded log-probabilities, "
                    f"but {'; '.join(found)} changes the distribution the sampler draws from in a way the trainer "
                    "does not repeat when it scores the policy (the ratio would not be 1 on a fresh batch). Drop it "
                    "(repetition_penalty=1.0, or remove it from generation_kwargs), or set async_rollouts=False."
                )
        if not self.async_timeout > 0:
            raise ValueError(f"async_timeout must be > 0 seconds, got {self.async_timeout}.")
        if self.async_generator != "inline" and self.async_rollouts is not False and self.max_staleness < 1:
            raise ValueError(
                f"async_generator={self.async_generator!r} samples ahead of the trainer, which max_staleness=0 "
                "forbids: set max_staleness >= 1, or async_generator='inline'."
            )
        if (
            self.async_generator == "server"
            and self.async_rollouts is not False
            and (not self.use_vllm or self.vllm_mode != "server")
        ):
            raise ValueError(
                "async_generator='server' sends the batches ahead to TRL's vLLM server: set use_vllm=True and "
                f"vllm_mode='server' (got use_vllm={self.use_vllm}, vllm_mode={self.vllm_mode!r}), or use "
                "async_generator='process' (HF generate in a worker process)."
            )

    def _resolve_icepop_band(self) -> None:
        """``token_icepop`` runs IcePop's band ``[0.5, 5]`` unless a bound was given: a bound left at TRL's default
        (``clip_min=None``, ``clip_max=3.0``, the ``sequence_mask`` defaults) takes IcePop's."""
        if self.vllm_importance_sampling_mode != ICEPOP_MODE:
            return
        trl_min, trl_max = (
            GRPOConfig.__dataclass_fields__[f"vllm_importance_sampling_clip_{bound}"].default
            for bound in ("min", "max")
        )
        if self.vllm_importance_sampling_clip_min == trl_min:
            self.vllm_importance_sampling_clip_min = ICEPOP_BAND[0]
        if self.vllm_importance_sampling_clip_max == trl_max:
            self.vllm_importance_sampling_clip_max = ICEPOP_BAND[1]

    def _resolve_ratio_anchor(self) -> None:
        """``ratio_anchor`` checked against the objective's declared anchors, and ``None`` resolved where the run's
        synchrony is known (``async_rollouts`` ``True`` or ``False``; ``None`` is resolved by the trainer).
        ``"decoupled"`` runs TRL's correction in AReaL's per-token truncation (``resolve_anchor``)."""
        if self.ratio_anchor is None and self.async_rollouts is None:
            return
        self.resolve_ratio_anchor(bool(self.async_rollouts))

    def resolve_ratio_anchor(self, asynchronous: bool) -> None:
        """Set ``ratio_anchor`` (checked, or resolved from ``None`` for a run that is ``asynchronous`` or not) and the
        correction mode it runs (``resolve_anchor``); the trainer calls it where ``async_rollouts=None`` left the
        choice to it."""
        self.ratio_anchor, self.vllm_importance_sampling_mode = resolve_anchor(
            self.ratio_anchor,
            ratio_anchors(self.policy_loss),
            async_anchor(self.policy_loss),
            asynchronous,
            policy_loss=self.policy_loss,
            correction=self.vllm_importance_sampling_correction,
            mode=self.vllm_importance_sampling_mode,
            trl_default_mode=GRPOConfig.__dataclass_fields__["vllm_importance_sampling_mode"].default,
        )

    def _validate_reward_fields(self) -> None:
        """Reward functions, their errors, and what counts as a task reward and a pass."""
        if self.task_pass_threshold is not None and not math.isfinite(self.task_pass_threshold):
            raise ValueError(f"task_pass_threshold must be a finite number or None, got {self.task_pass_threshold}.")
        if self.reward_timeout is not None and not self.reward_timeout > 0:
            raise ValueError(f"reward_timeout must be > 0 seconds (or None for no limit), got {self.reward_timeout}.")
        if self.on_reward_error not in REWARD_ERROR_POLICIES:
            raise ValueError(
                f"Unknown on_reward_error {self.on_reward_error!r}. Allowed values: {', '.join(REWARD_ERROR_POLICIES)}."
            )
        patience = self.nonfinite_loss_patience
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"nonfinite_loss_patience must be an int >= 0, got {patience!r}.")
        threshold = self.positive_resampling_threshold
        if threshold is not None and not 0.0 < threshold <= 1.0:
            raise ValueError(
                f"positive_resampling_threshold must be in (0, 1] (a group pass rate) or None, got {threshold}."
            )
        if isinstance(self.task_reward_funcs, str):
            self.task_reward_funcs = [self.task_reward_funcs]
        if self.task_reward_funcs is not None:
            names = list(self.task_reward_funcs)
            if not names or not all(isinstance(name, str) and name for name in names):
                raise ValueError(
                    f"task_reward_funcs must be a non-empty list of reward function names (or None for all), got "
                    f"{self.task_reward_funcs!r}."
                )
            self.task_reward_funcs = names

    def _validate_reward_clip_range(self) -> None:
        clip_range = self.reward_clip_range
        if clip_range is None:
            return
        if isinstance(clip_range, str) or not hasattr(clip_range, "__len__") or len(clip_range) != 2:
            raise ValueError(f"reward_clip_range must be a pair (min, max) or None, got {clip_range!r}.")
        try:
            low, high = (float(bound) for bound in clip_range)
        except (TypeError, ValueError):
            raise ValueError(f"reward_clip_range must hold two numbers (min, max), got {clip_range!r}.") from None
        if math.isnan(low) or math.isnan(high) or low > high:
            raise ValueError(f"reward_clip_range=(min, max) needs min <= max, got {clip_range!r}.")
        self.reward_clip_range = (low, high)

    def _validate_ordering(self) -> None:
        """Bounds that only make sense in one order, each error naming the fields (a loss's own, such as the clip's
        ``epsilon_high >= epsilon``, are its registered checks)."""
        if self.delta is not None and self.delta <= 1.0:
            raise ValueError(
                f"delta={self.delta} must be > 1: it is the upper bound of two-sided clipping on the ratio, and a bound "
                "at or below the on-policy ratio 1 cuts the gradient of every token (TRL recommends delta > 1 + "
                "epsilon_high)."
            )
        if self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(
                f"entropy_coef_min={self.entropy_coef_min} is above entropy_coef_max={self.entropy_coef_max}."
            )
        if not 0.0 < self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")

    def _resolve_overlong_cache_length(self) -> None:
        value = self.overlong_cache_length
        if value is None:
            return
        if isinstance(value, str):
            if value.lower() in ("none", "null"):
                self.overlong_cache_length = None
                return
            if value == "auto":
                if not self.max_completion_length:
                    raise ValueError("overlong_cache_length='auto' needs max_completion_length to be set.")
                value = max(1, round(_OVERLONG_AUTO_FRACTION * self.max_completion_length))
            elif value.strip().isdigit():
                value = int(value)
            else:
                raise ValueError(
                    f"overlong_cache_length must be a positive int, 'auto' or None, got {self.overlong_cache_length!r}."
                )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"overlong_cache_length must be a positive int, 'auto' or None, got {value!r}.")
        if self.max_completion_length is None or value > self.max_completion_length:
            raise ValueError(
                f"overlong_cache_length={value} must not exceed max_completion_length={self.max_completion_length}."
            )
        self.overlong_cache_length = value


#: Where each preset default comes from, per dataclass field object. Not kept in the field's metadata: transformers'
#: HfArgumentParser passes every metadata entry to argparse. The metadata's help text gets the source appended, so
#: ``trl-reasoning dapo --help`` shows it.
_SOURCES: dict[dataclasses.Field, str] = {}


def preset_default(name: str, value: Any, *, source: str):
    """A dataclass field that re-declares ``ReasoningConfig.name`` with a preset's default, keeping its help text and
    recording where the value comes from (``source``: the paper's section or equation, the authors' code file, or
    TRL), which :func:`preset_sources`, the preset's docstring, ``--help`` and the table of docs/presets.md show."""
    parent = ReasoningConfig.__dataclass_fields__[name]
    if not source.strip():
        raise ValueError(f"preset_default({name!r}): every preset default needs a source")
    metadata = dict(parent.metadata)
    metadata["help"] = f"{metadata.get('help', '').rstrip()} Preset default from: {source}.".strip()
    preset_field = field(default=value, metadata=metadata)
    _SOURCES[preset_field] = source
    return preset_field


def preset_sources(config_class: type[ReasoningConfig]) -> dict[str, tuple[Any, str]]:
    """``{field: (default, source)}`` for every default a preset sets with :func:`preset_default`, in field order."""
    return {f.name: (f.default, _SOURCES[f]) for f in dataclasses.fields(config_class) if f in _SOURCES}


def document_sources(config_class: type[ReasoningConfig]) -> type[ReasoningConfig]:
    """Class decorator: append each default and its source to the preset's docstring (``help(DAPOConfig)``)."""
    lines = [f"    - `{name}={value!r}`: {source}" for name, (value, source) in preset_sources(config_class).items()]
    config_class.__doc__ = (
        (config_class.__doc__ or "").rstrip()
        + "\n\n    Defaults and where they come from:\n\n"
        + "\n".join(lines)
        + "\n"
    )
    return config_class


def sources_markdown(config_classes: list[type[ReasoningConfig]]) -> str:
    """The table of every preset's defaults and their sources (docs/presets.md, "Where each default comes from")."""
    rows = ["| preset | default | source |", "|---|---|---|"]
    for config_class in config_classes:
        for name, (value, source) in preset_sources(config_class).items():
            rows.append(f"| `{config_class.__name__}` | `{name}={value!r}` | {source} |")
    return "\n".join(rows) + "\n"


def bibtex(key: str, title: str, authors: str, year: int, arxiv_id: str) -> str:
    """A BibTeX ``@article`` entry for an arXiv paper (used by the model card)."""
    return (
        f"@article{{{key},\n    title   = {{{{{title}}}}},\n    author  = {{{authors}}},\n"
        f"    year    = {year},\n    eprint  = {{arXiv:{arxiv_id}}},\n}}"
    )


#: The markers of the generated field table in docs/configuration.md (``variant_fields_markdown``).
FIELD_TABLE_MARKERS = ("<!-- config-fields:start -->\n", "<!-- config-fields:end -->")


def _table_cell(text: str) -> str:
    """``text`` as one Markdown table cell: reStructuredText's roles and double backticks as code, pipes escaped."""
    return re.sub(r":\w+:`", "`", text).replace("``", "`").replace("|", "\\|")


def _traits_cell(registry: Registry, name: str) -> str:
    """The traits ``name`` was registered with: a flag's name, or ``key=value`` for a text value."""
    traits = []
    for key, value in sorted(registry.traits(name).items()):
        if isinstance(value, str):
            traits.append(f"`{key}={value}`")
        elif isinstance(value, tuple) and all(isinstance(item, str) for item in value):
            traits.append(f"`{key}={'/'.join(value)}`")
        elif value:
            traits.append(f"`{key}`")
    return ", ".join(traits)


def variant_fields_markdown() -> str:
    """The table of docs/configuration.md: each field that chooses a variant, its registered values (the first
    paragraph of each one's docstring, its traits, the fields it declares), then every declared field's default."""
    lines: list[str] = []
    for field_name, registry in VARIANT_REGISTRIES.items():
        lines += [f"#### `{field_name}` ({registry.kind})", ""]
        lines += ["| value | what it is | traits | its fields |", "|---|---|---|---|"]
        for name in registry.names():
            own = ", ".join(f"`{declared.name}`" for declared in registry.fields(name))
            description = _table_cell(registry.description(name))
            lines.append(f"| `{name}` | {description} | {_traits_cell(registry, name)} | {own} |")
        lines.append("")
    lines += ["#### The variants' own fields", "", "| field | default | read by | meaning |", "|---|---|---|---|"]
    for field_name, declared in VARIANT_FIELDS.items():
        default = ReasoningConfig.__dataclass_fields__[field_name].default
        readers = [
            f"{chooser}=`{name}`"
            for chooser, registry in VARIANT_REGISTRIES.items()
            for name in registry.names()
            if declared in registry.fields(name)
        ]
        owner = " (TRL's field)" if declared.defined_by_trl else ""
        row = f"| `{field_name}` | `{default!r}` | {', '.join(readers)} | {_table_cell(declared.help)}{owner} |"
        lines.append(row)
    return "\n".join(lines) + "\n"
