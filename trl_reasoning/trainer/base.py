"""The seam between trl-reasoning's math and TRL: ``ReasoningTrainer`` (its ``ReasoningConfig`` lives in
``config.py``).

Two parts answer "where does a batch come from": ``rollout.Rollout`` (generation rounds, rewards and shaping, group
selection, retirement) and, with ``async_rollouts``, ``async_rollouts.pipeline.AsyncRollouts`` (the behaviour weights and the
generator that samples ahead). The trainer calls them and lends them TRL's methods (``trl_round``, ``trl_generate``,
``behaviour_logps``, ``tokenize_prompts``); "how is it trained on" is this module's loss path (``_compute_loss``).
Two more parts serve the loss path: ``correction.ImportanceCorrection`` (the importance-sampling correction between
``pi_old`` and the sampler, the ratio anchor and their metrics) and ``topk_forward.TopKForward`` (DPPO's top-K
forward and its chunked LM head). What each part may read from or write to the trainer is a ``Protocol``:
``rollout.RolloutHost``, ``async_rollouts.protocols.AsyncRolloutHost`` (with ``VLLMBackendHost`` or
``GenerateBackendHost`` by backend), ``correction.CorrectionHost`` and ``topk_forward.TopKForwardHost`` (with
``TopKEngineHost`` under vLLM), checked by name when a trainer is built (:func:`check_rollout_host`).

This is the only module that overrides TRL's private methods (the overrides delegate to the parts). All of them are
listed in ``TRL_PRIVATE_API`` of ``trl_api.py`` (the TRL-API guard, where every name of this paragraph lives) with the
parameter names checked against ``TRL_CHECKED_VERSION``; ``check_trl_private_api`` (run when a trainer is built and
by a test) fails loudly, naming the method, when an installed TRL no longer matches. Every ``GRPOTrainer`` attribute
the package reads or writes is in ``TRL_INSTANCE_ATTRIBUTES`` (or, set by TRL for one generation backend only,
``TRL_VLLM_INSTANCE_ATTRIBUTES`` / ``TRL_GENERATE_INSTANCE_ATTRIBUTES``), checked in TRL's ``__init__`` source by
``check_trl_private_api`` and on the built trainer.

How a step works, on top of TRL's ``GRPOTrainer``:

1. ``_calculate_rewards`` (TRL's, wrapped): the gathered ``(N, n_funcs)`` rewards are checked by function name and
   kept, together with every completion's length, for step 2.
2. ``_generate_and_score_completions`` (TRL's, once per generation round, then post-processed): the combined reward
   gets the configured shaping (``algorithms/shaping.py``); the group-selection strategy (``algorithms.group_selection.sample_groups``: all,
   zero-variance filtering or dynamic sampling) decides which groups train and whether to generate more;
   ``advantage_estimator`` turns the rewards into advantages on the whole gathered batch, and ``loss_aggregation``
   gives each completion a weight ``w_i`` fixed on that batch (``algorithms/batch.py``, ``loss_weights``), which travels with
   the row through TRL's shuffle and split.
3. ``_compute_loss``: ``policy_loss`` gives the per-token loss, TRL's options act on it as in TRL (off-policy mask,
   entropy mask, vLLM importance-sampling correction, ``beta`` KL, entropy bonus, MoE aux loss), and the micro-batch
   loss is ``sum_i w_i sum_t l_it m_it``, scaled so that gradient accumulation and DDP averaging sum to the loss of
   the whole batch.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
import weakref
from typing import Any

import torch
from datasets import IterableDataset
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from ..algorithms.advantages import ADVANTAGE_ESTIMATORS
from ..algorithms.aggregation import AGGREGATIONS, aggregate_loss, completion_weights
from ..algorithms.batch import TrainBatch
from ..algorithms.importance_sampling import ICEPOP_MODE
from ..algorithms.losses import POLICY_LOSSES, compute_policy_loss
from ..algorithms.sampling_processors import model_generation_defaults, overridden_settings, unreproduced_settings
from ..algorithms.trl_mirror import k3_kl, masked_means_over_processes
from ..algorithms.truncation import sampling_truncation
from ..async_rollouts.pipeline import async_rollouts_for
from ..async_rollouts.protocols import AsyncRolloutHost, EnvironmentHost, GenerateBackendHost, VLLMBackendHost
from ..config import ReasoningConfig
from ..models.lm_head import cast_lm_head_to_fp32, unwrap_peft
from ..models.model_card import ReasoningModelCardMixin
from ..rewards.wrapping import check_reward_columns, wrap_reward_function
from ..utils.checkpointing import activation_checkpointing_disabled
from ..utils.config_changes import mark_checked
from ..utils.user_warnings import user_stacklevel
from .checkpoints import damaged_weight_files, last_complete_checkpoint
from .correction import CorrectionHost, ImportanceCorrection, uses_trl_is_ratio
from .guards import NonFiniteStepGuard, warn_if_fsdp_not_applied, warn_if_launcher_lost_processes
from .padding_free import PaddingFree, PaddingFreeHost
from .prompt_lengths import ContextGuard, render_prompts
from .reference_reset import reference_kept_on_resume, reference_reset_for
from .rollout import Rollout, RolloutHost, loss_tokens
from .tool_calls import tool_calls_guarded
from .topk_forward import (
    FORWARD_KEYS,
    TopKEngineHost,
    TopKForward,
    TopKForwardHost,
    model_inputs,
    uses_topk_divergence,
)
from .trl_api import (
    TRL_CHECKED_VERSION,
    TRL_FUSED_LM_HEAD_OUTPUTS,
    TRLCompatibilityError,
    check_rollout_host,
    check_trl_private_api,
    trl_instance_attributes,
)

logger = logging.getLogger(__name__)


def _is_composite_model(model, args) -> bool:
    """Whether ``model`` (a model or the path TRL will load it from) is a composite model, such as a vision-language
    model, whose language model sits one level deeper than ``model.model``."""
    config = getattr(model, "config", None)
    if config is None and isinstance(model, str):
        from transformers import AutoConfig

        init = args.model_init_kwargs or {}
        try:
            config = AutoConfig.from_pretrained(
                model, revision=init.get("revision"), trust_remote_code=init.get("trust_remote_code", False)
            )
        except (OSError, ValueError):
            return False  # TRL reports a model it cannot load itself
    return config is not None and config.get_text_config() is not config


class _PartAttribute:
    """A trainer attribute that is one of its parts' (``part``, an attribute of the trainer): reading, writing and
    deleting it on the trainer reads, writes and deletes ``name`` (by default the same name) on the part."""

    def __init__(self, part: str, name: str | None = None) -> None:
        self.part, self.name = part, name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        if trainer is None:
            return self
        return getattr(getattr(trainer, self.part), self.name)

    def __set__(self, trainer: Any, value: Any) -> None:
        setattr(getattr(trainer, self.part), self.name, value)

    def __delete__(self, trainer: Any) -> None:
        delattr(getattr(trainer, self.part), self.name)


class ReasoningTrainer(ReasoningModelCardMixin, GRPOTrainer):
    """A [`~trl.GRPOTrainer`] whose advantage estimator, policy objective, loss aggregation and reward shaping are
    chosen by name in a [`ReasoningConfig`]. Takes exactly `GRPOTrainer`'s arguments.

    Subclasses (the presets) set ``config_class`` to their config dataclass; passing a config of another class
    raises a ``TypeError``.
    """

    config_class: type[ReasoningConfig] = ReasoningConfig
    # What TRL's model card reads: the tags, the name and (inherited from GRPOTrainer here) the paper dict. A preset
    # sets ``_name``, ``_tag`` (its own tag) and ``paper`` (``presets.provenance.Paper``); ``__init_subclass__``
    # derives ``_tag_names`` and ``_paper`` from them.
    _tag_names = ["trl", "trl-reasoning"]
    _name = "trl-reasoning"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that sets ``_tag`` gets ``_tag_names`` = these tags plus it, and one that sets ``paper`` gets
        ``_paper = paper.trl_paper()``, unless it sets them itself; one that sets neither keeps its parent's (a user's
        ``class MyDAPO(DAPOTrainer): pass`` is still DAPO on the model card)."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "_tag" in own and "_tag_names" not in own:
            cls._tag_names = [*ReasoningTrainer._tag_names, cls._tag]
        if "paper" in own and "_paper" not in own:
            cls._paper = cls.paper.trl_paper()

    # DPPO's engine top-K, a member of ``AsyncRolloutHost`` (the asynchronous rollouts append the vLLM server's):
    # read, written and deleted on the top-K part.
    _engine_topk = _PartAttribute("topk_forward", "engine_topk")

    def __init__(self, model, reward_funcs=None, args: ReasoningConfig | None = None, *more, **kwargs):
        check_trl_private_api()
        args = self._checked_args(model, args)
        # TRL's cast_lm_head_to_fp32 reaches for `model.model.embed_tokens` when the embeddings are tied, which a PEFT
        # model and a vision-language model (its embeddings sit in `model.model.language_model`) do not have: there
        # this trainer casts the head itself (see trl_reasoning.models.lm_head).
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, model, reward_funcs, args, *more, **kwargs)
        own_fp32_head = args.cast_lm_head_to_fp32 and (
            bound.arguments.get("peft_config") is not None
            or hasattr(model, "peft_config")
            or _is_composite_model(model, args)
        )
        if own_fp32_head:
            args.cast_lm_head_to_fp32 = False
        try:
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        finally:
            args.cast_lm_head_to_fp32 = args.cast_lm_head_to_fp32 or own_fp32_head
        if own_fp32_head:
            self._cast_peft_lm_head_to_fp32()
        missing = [name for name in trl_instance_attributes(self.use_vllm) if not hasattr(self, name)]
        if missing:
            raise TRLCompatibilityError(
                f"The installed TRL's GRPOTrainer no longer sets {', '.join(missing)}, which trl-reasoning reads "
                f"(checked against TRL {TRL_CHECKED_VERSION})."
            )
        self._init_seam_state()
        mark_checked(self.args)  # what the trainer resolved itself (ratio_anchor, ...) is no change to check again
        self._drop_overlong_prompts()
        self._check_datasets()
        if self.accelerator.is_main_process:
            warn_if_launcher_lost_processes(self.accelerator.num_processes)
            fsdp_requested = bool(self.args.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
            warn_if_fsdp_not_applied(fsdp_requested, self.accelerator.distributed_type)

    def _init_seam_state(self) -> None:
        """This trainer's own state next to TRL's: wrapped reward functions, the task-reward columns, the group
        selection, the sampling state a checkpoint keeps, the non-finite-step guard and DPPO top-K's switches."""
        self.reward_funcs = [
            func
            if isinstance(func, torch.nn.Module)
            else wrap_reward_function(func, name, self.args.on_reward_error, self.args.reward_timeout)
            for func, name in zip(self.reward_funcs, self.reward_func_names, strict=True)
        ]
        self._scored_batch: tuple[torch.Tensor, torch.Tensor] | None = None
        # Padding-free forwards (trainer/padding_free.py): whether the run packs, and the packed forwards.
        check_rollout_host(self, PaddingFreeHost)
        self.packing = PaddingFree(self)
        # DPPO's top-K forward (trainer/topk_forward.py; its defaults: LM head from the hidden states, no engine top-K),
        # reading this trainer only through its protocols, packing as the run does.
        check_rollout_host(self, TopKForwardHost, *((TopKEngineHost,) if self.use_vllm else ()))
        self.topk_forward = TopKForward(self, self.packing)
        # Where a batch comes from: generation rounds, shaping, group selection, prompt sampling (its state is saved
        # in checkpoints). It and the asynchronous rollouts read this trainer only through their protocols.
        check_rollout_host(self, RolloutHost)
        self.rollout = Rollout(self)
        self.add_callback(self.rollout.callback)
        # Non-finite loss guard: compute_loss records each micro-batch, the optimizer's step reads it.
        self._nonfinite_guard = NonFiniteStepGuard(self.args.nonfinite_loss_patience)
        # ProRL's reference reset (reference_reset_steps / reference_reset_kl): reference := policy and a fresh optimizer
        # state at a rollout boundary (trainer/reference_reset.py); its state and the reference go in checkpoints.
        self.reference_reset = reference_reset_for(self)
        if self.reference_reset is not None:
            self.add_callback(self.reference_reset)
        # DPPO top-K: vLLM's own top-K when vLLM generates.
        if self.use_vllm and self._uses_topk_divergence:
            self.topk_forward.keep_engine_topk()
        # Asynchronous rollouts (trl_reasoning.async_rollouts.pipeline): the behaviour policy's weights, saved in checkpoints,
        # and the generator that samples ahead.
        backend = (VLLMBackendHost if self.use_vllm else GenerateBackendHost,)
        check_rollout_host(
            self, AsyncRolloutHost, *backend, *((EnvironmentHost,) if self.environment_factories else ())
        )
        self.async_rollouts = async_rollouts_for(self, self._sampler_settings_problem())
        # The vLLM / asynchronous importance-sampling correction (trainer/correction.py): the ratio anchor, who builds
        # its weight, and its metrics of the generation batch being trained on (accumulated over the micro-batches when
        # the loss builds it); built once the asynchronous rollouts are, reading this trainer through its protocol.
        check_rollout_host(self, CorrectionHost)
        self.correction = ImportanceCorrection(self)

    def _sampler_settings_problem(self) -> str | None:
        """Why the sampler's log-probabilities ``mu`` cannot meet the policy's in a ratio: the generation settings
        that change the distribution sampled from beyond the temperature and truncation the trainer repeats
        (``trl_reasoning.algorithms.sampling_processors``), TRL's and, for ``generate``, those the model's own
        ``generation_config`` adds. On a synchronous vLLM run whose loss reads ``mu`` (TRL accepts the settings
        there) they are a warning."""
        if self.use_vllm:
            settings = {"repetition_penalty": self.args.repetition_penalty, **(self.args.generation_kwargs or {})}
            found = unreproduced_settings(settings, "vllm")
        else:
            own = self.generation_config.to_dict()
            model_config = getattr(unwrap_peft(self.model), "generation_config", None)
            inherited = model_generation_defaults(own, model_config.to_dict() if model_config is not None else {})
            found = unreproduced_settings({**own, **inherited}, "generate")
            found = [
                f"{item}, from the model's generation_config" if item.split("=")[0] in inherited else item
                for item in found
            ]
            if inherited.get("min_p"):
                found.append(
                    f"min_p={inherited['min_p']!r}, from the model's generation_config (set min_p in the config so "
                    "the trainer scores on the same support)"
                )
        found += overridden_settings(self.args.temperature, self.args.generation_kwargs)
        if not found:
            return None
        problem = (
            f"{'; '.join(found)} changes the distribution the sampler draws from in a way the trainer does not "
            "repeat when it scores the policy, so pi / mu would not be 1 on a fresh batch (drop the setting, or give "
            "it its neutral value in generation_kwargs where the model's generation_config sets it)"
        )
        reads_mu = self.args.vllm_importance_sampling_correction or not self._uses_trl_is_ratio()
        if self.use_vllm and self.args.async_rollouts is False and reads_mu:
            warnings.warn(
                f"The sampler's log-probabilities enter the loss, but {problem}.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return problem

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The Trainer's; with a generator that samples ahead, the next ``max_staleness`` steps' batches are read
        ahead (``AsyncRollouts.batch_samples``)."""
        if self.async_rollouts is not None and self.async_rollouts.pipeline is not None:
            batches = self.async_rollouts.batch_samples(epoch_iterator, num_batches)
            epoch_iterator, num_batches = iter(batches), len(batches)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    @property
    def last_train_batch(self) -> TrainBatch | None:
        """What the last training batch was built from (``trl_reasoning.algorithms.batch.TrainBatch``): its gathered rewards and
        advantages, the groups that train, this process's loss weights and the generation rounds behind it."""
        return self.rollout.last_batch

    def _checked_args(self, model, args: ReasoningConfig | None) -> ReasoningConfig:
        """``args``, or the preset's defaults when ``None`` (as ``GRPOTrainer`` does); a config of another class is
        refused, since it would silently train another algorithm."""
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = self.config_class(output_dir=f"{str(name).rstrip('/').split('/')[-1] or 'model'}-{self._name}")
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__} as `args`, got "
                f"{type(args).__name__}. Build it with the same arguments: {self.config_class.__name__}(...)."
            )
        args.recheck_changed_fields()  # a field set after construction is checked as construction checks it
        return args

    def _check_datasets(self) -> None:
        """A ``prompt`` column in every dataset; a streaming training set gets its retired prompts filtered out."""
        for split, dataset in (("train_dataset", self.train_dataset), ("eval_dataset", self.eval_dataset)):
            for data in dataset.values() if isinstance(dataset, dict) else [dataset]:
                columns = getattr(data, "column_names", None)
                if columns is not None and "prompt" not in columns and self.environment_factories is None:
                    raise ValueError(
                        f"The {split} has no 'prompt' column (its columns: {', '.join(columns) or 'none'}). GRPO-style "
                        "trainers generate from a 'prompt' column of text or chat messages; rename yours, e.g. "
                        "dataset.rename_column('question', 'prompt')."
                    )
        if self.args.positive_resampling_threshold is not None and isinstance(self.train_dataset, IterableDataset):
            self.train_dataset = self.rollout.without_retired_prompts(self.train_dataset)

    def _cast_peft_lm_head_to_fp32(self) -> None:
        """The FP32 LM head where TRL's cast fails (PEFT, vision-language models): cast the base model's head (and the
        reference model's, which TRL casts too), then rebuild TRL's fused LM heads (built while the flag was off) so
        that they, too, project in float32."""
        for model, outputs in ((self.model, TRL_FUSED_LM_HEAD_OUTPUTS), (self.ref_model, None)):
            if model is None:
                continue
            base = unwrap_peft(model)
            cast_lm_head_to_fp32(model)
            if "forward" in vars(base):  # TRL's fused head, an instance attribute over the class's forward
                del base.forward
            # TRL 1.16's own calls (GRPOTrainer.__init__), with the flag on.
            options = {} if outputs is None else {"outputs": outputs}
            add_fused_lm_head(base, temperature=self.temperature, cast_lm_head_to_fp32=True, **options)

    # ------------------------------------------------------------------ TRL private override 1 of 10
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if getattr(self.args, "on_reward_error", "raise") == "exclude":
            mode = "train" if self.model.training else "eval"
            counters = ("error_count", "retried_count")
            counts = torch.tensor(
                [[float(getattr(func, counter, 0)) for counter in counters] for func in self.reward_funcs],
                device=rewards_per_func.device,
            )
            for func in self.reward_funcs:
                for counter in counters:
                    if hasattr(func, counter):
                        setattr(func, counter, 0)
            counts = self.accelerator.reduce(counts, reduction="sum")
            for name, (errors, retried) in zip(self.reward_func_names, counts.tolist()):
                self._metrics[mode][f"rewards/{name}/errors"].append(errors)
                self._metrics[mode][f"rewards/{name}/retried_ok"].append(retried)
        check_reward_columns(rewards_per_func, self.reward_func_names)
        device = rewards_per_func.device
        lengths = torch.tensor([len(ids) for ids in completion_ids_list], dtype=torch.float32, device=device)
        self._scored_batch = (rewards_per_func, self.accelerator.gather(lengths))
        return rewards_per_func

    # ------------------------------------------------------------------ TRL private override 2 of 10
    def _generate_and_score_completions(self, inputs):
        """Where a batch comes from is ``self.rollout`` (``trl_reasoning.trainer.rollout``): rounds, shaping, selection."""
        if getattr(self, "rollout", None) is None:  # a trainer not built by __init__ (TRL's tests): TRL's method
            return super()._generate_and_score_completions(inputs)
        if getattr(self, "async_rollouts", None) is not None and self.model.training:
            self.async_rollouts.begin_generation_step(inputs)
        return self.rollout.generation_batch(inputs, "train" if self.model.training else "eval")

    def trl_round(self, inputs) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """One round of TRL's own generation and scoring of ``inputs`` (this process's rows): TRL's output, and the
        rewards per function and completion lengths of the gathered batch (captured by ``_calculate_rewards``)."""
        self._scored_batch = None
        if self.topk_forward.engine_topk is not None:
            self.topk_forward.engine_topk = []
        with self.correction.scoring() as corrected:
            output = super()._generate_and_score_completions(inputs)
            if corrected and self.correction.source == "scoring":
                self.correction.at_scoring(output)
        if self._scored_batch is None:
            raise TRLCompatibilityError(
                "GRPOTrainer._generate_and_score_completions no longer calls _calculate_rewards; trl-reasoning "
                f"cannot see the rewards (checked against TRL {TRL_CHECKED_VERSION})."
            )
        rewards_per_func, lengths = self._scored_batch
        self._scored_batch = None
        if self.correction.source == "trl" and "importance_sampling_ratio" in output:
            self.correction.log_trl_correction(output)
        return output, rewards_per_func, lengths

    # ------------------------------------------------------------------ TRL private override 3 of 10
    def _generate(self, prompts):
        """TRL's, or with asynchronous rollouts ``AsyncRollouts.generate``: the behaviour policy samples a training
        batch and its log-probabilities are recorded; tool calls guarded (``tool_calls``). It assumes no state TRL's
        method does not (TRL's tests call it on a trainer built without ``__init__``)."""
        with tool_calls_guarded(self):
            rollouts = getattr(self, "async_rollouts", None)
            return super()._generate(prompts) if rollouts is None else rollouts.generate(prompts)

    # ------------------------------------------------------------------ TRL private override 4 of 10
    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        """TRL's, or a later turn of a batch a generator process sampled ahead (TRL's tool loop): by that generator,
        with the batch's behaviour weights (``AsyncRollouts.later_turn``)."""
        rollouts = getattr(self, "async_rollouts", None)
        turn = None if rollouts is None else rollouts.later_turn(prompt_ids)
        return super()._generate_single_turn(prompt_ids, *args, **kwargs) if turn is None else turn

    # ------------------------------------------------------------------ TRL private override 5 of 10
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **forward_inputs,
    ):
        """TRL's, on packed rows with ``padding_free`` (``PaddingFree.logps_and_entropies``), or with
        ``truncated_support_scoring`` the log-probs of the sampler's truncated distribution
        (``TopKForward.logps_on_sampling_support``, packed too): every policy TRL scores here (``pi_theta`` in the
        loss, ``pi_old``, the reference) on its own truncated support, like the sampler's log-probs."""
        arguments = (model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss)
        if getattr(self.args, "truncated_support_scoring", False):
            engine = "vllm" if self.args.use_vllm else "generate"
            args = self.args
            truncation = sampling_truncation(args.top_k, args.top_p, args.min_p, args.generation_kwargs, engine=engine)
            return self.topk_forward.logps_on_sampling_support(*arguments, forward_inputs, truncation)
        packing = getattr(self, "packing", None)  # None on a trainer built without __init__ (TRL's tests)
        packed = packing.logps_and_entropies(*arguments, **forward_inputs) if packing is not None else None
        return packed or super()._get_per_token_logps_and_entropies(*arguments, **forward_inputs)

    def trl_generate(self, prompts):
        """TRL's own ``_generate`` (lent to the asynchronous rollouts), its output checked."""
        generated = super()._generate(prompts)
        if not isinstance(generated, tuple) or len(generated) != 8:
            raise TRLCompatibilityError(
                "GRPOTrainer._generate no longer returns (prompt_ids, completion_ids, tool_mask, completions, "
                f"logprobs, extra_fields, images, tool_images) (checked against TRL {TRL_CHECKED_VERSION})."
            )
        return generated

    def rollout_topk(self, output, mode: str) -> dict[str, torch.Tensor]:
        """DPPO top-K: the sampler's top-K ids and log-probs (``TopKForward.rollout_topk``), from the behaviour
        weights on an asynchronous batch sampled by ``generate`` (vLLM's own top-K already comes from them)."""
        if self.async_rollouts is None:
            return self.topk_forward.rollout_topk(output, mode)
        with self.async_rollouts.behaviour_weights_in(mode, engine_topk=bool(self.topk_forward.engine_topk)):
            return self.topk_forward.rollout_topk(output, mode)

    @property
    def _uses_topk_divergence(self) -> bool:
        """Whether the loss reads the rollout top-K (DPPO's ``topk_tv`` / ``topk_kl``)."""
        return uses_topk_divergence(self.args)

    def tokenize_prompts(self, prompts: list) -> list[list[int]]:
        """The prompt token ids TRL generates from (TRL's ``_tokenize_prompts``)."""
        return self._tokenize_prompts(prompts)[0]

    def check_context_length(self, output) -> None:
        """The prompts of a generation batch must fit the context with their completions (``ContextGuard``)."""
        self.context_guard.check_batch(output["prompt_ids"], output["prompt_mask"])

    def _drop_overlong_prompts(self) -> None:
        """Prompts that cannot fit the context with ``max_completion_length`` tokens leave the training and evaluation
        datasets with a warning naming each (``filter_overlong_prompts=True``), or are refused by name. Environments
        (their reset text and tools are added per rollout) and image prompts are left to the check at generation."""
        self.context_guard = ContextGuard(
            getattr(self._bare_model().config.get_text_config(), "max_position_embeddings", None),
            self.max_completion_length,
            render=lambda prompts: render_prompts(
                self.processing_class, prompts, self.tools, self.chat_template, **self.chat_template_kwargs
            ),
            count_tokens=lambda prompts: [len(ids) for ids in self.tokenize_prompts(prompts)],
            decode=lambda ids: self._tokenizer.decode(ids, skip_special_tokens=True),
            drop=self.args.filter_overlong_prompts,
        )
        if self.environment_factories is not None or self._is_vlm:
            return
        guard = self.context_guard
        self.train_dataset = guard.without_overlong(self.train_dataset, "train_dataset")
        # A streamed evaluation set is checked as it is read, so it stays the user's object (as in TRL, whose tests
        # assert `trainer.eval_dataset is eval_dataset`): the check is attached when its dataloader is built.
        if isinstance(self.eval_dataset, dict):
            self.eval_dataset = {
                name: data
                if isinstance(data, IterableDataset)
                else guard.without_overlong(data, f"eval_dataset[{name!r}]")
                for name, data in self.eval_dataset.items()
            }
            self._eval_split_names = {id(data): f"eval_dataset[{name!r}]" for name, data in self.eval_dataset.items()}
        elif not isinstance(self.eval_dataset, IterableDataset):
            self.eval_dataset = guard.without_overlong(self.eval_dataset, "eval_dataset")

    def get_eval_dataloader(self, eval_dataset=None):
        """TRL's, with a streamed evaluation set read through the context check (``ContextGuard``) that a map-style
        one passed at construction: its overlong prompts are skipped with a warning naming them (or refused by name
        with ``filter_overlong_prompts=False``)."""
        resolved = (
            self.eval_dataset[eval_dataset]
            if isinstance(eval_dataset, str) and isinstance(self.eval_dataset, dict)
            else eval_dataset
            if eval_dataset is not None
            else self.eval_dataset
        )
        guard = getattr(self, "context_guard", None)
        if not isinstance(resolved, IterableDataset) or guard is None:
            return super().get_eval_dataloader(eval_dataset)
        if self.environment_factories is not None or self._is_vlm:
            return super().get_eval_dataloader(eval_dataset)
        # one check per stream, kept with the stream itself, so that a prompt skipped is warned about once however
        # many evaluations re-read it
        checked = self.__dict__.setdefault("_checked_eval_streams", {})
        if id(resolved) not in checked:
            split = getattr(self, "_eval_split_names", {}).get(id(resolved), "eval_dataset")
            checked[id(resolved)] = (resolved, guard.without_overlong(resolved, split))
        return super().get_eval_dataloader(checked[id(resolved)][1])

    def _bare_model(self, model: torch.nn.Module | None = None) -> torch.nn.Module:
        """``accelerator.unwrap_model(model)`` (the trained model by default), kept per wrapper: accelerate reads
        installed packages' metadata on every unwrap (about 1 ms), and the per-step checks need only the bare model."""
        model = self.model if model is None else model
        cache = self.__dict__.setdefault("_bare_models", weakref.WeakKeyDictionary())
        if model not in cache:
            cache[model] = self.accelerator.unwrap_model(model)
        return cache[model]

    # ------------------------------------------------------------------ TRL private override 6 of 10
    def _prepare_inputs(self, generation_batch):
        """TRL's; with ``padding_free`` the micro-batches of a fresh generation batch are rebalanced by real tokens
        within each optimizer step (``PaddingFree.balanced``: each step's gradient is unchanged)."""
        buffered = getattr(self, "_buffered_inputs", None)
        inputs = super()._prepare_inputs(generation_batch)
        if getattr(self, "packing", None) is None or self._buffered_inputs is buffered or not self.model.training:
            return inputs  # a trainer built without __init__ (TRL's tests), or no new generation batch here
        self._buffered_inputs = self.packing.balanced(self._buffered_inputs)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------ TRL private override 7 of 10
    def _get_train_sampler(self, dataset=None):
        """TRL's ``RepeatSampler`` order (epoch 0 is the same permutation), made a function of the epoch so that a
        resumed run sees the same prompts, and skipping retired prompts (see ``EpochRepeatSampler``)."""
        if getattr(self, "rollout", None) is None:  # a trainer not built by __init__ (TRL's tests): TRL's sampler
            return super()._get_train_sampler(dataset)
        if dataset is None:
            dataset = self.train_dataset
        return self.rollout.prompt_state.new_sampler(
            num_samples=len(dataset),
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
        )

    # ------------------------------------------------------------------ TRL private override 8 of 10
    def _save_checkpoint(self, model, trial):
        # The sampling state goes in first, atomically: the Trainer writes trainer_state.json last (then starts the hub
        # push), so a checkpoint whose trainer_state.json reads always holds its whole sampling state.
        if getattr(self, "rollout", None) is None:  # a trainer built without __init__ (TRL's tests): TRL's own
            return super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save:
            self.rollout.save(folder)
        if (
            getattr(self, "async_rollouts", None) is not None
        ):  # every process: each keeps the sampled batches of its rows
            self.async_rollouts.save(folder, write_shared=self.args.should_save)
        if getattr(self, "reference_reset", None) is not None:
            self.reference_reset.save(folder, write=self.args.should_save)
        super()._save_checkpoint(model, trial)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """The Trainer's, without the reference reset's ``"ref"`` adapter folder (training state, kept in the reset's
        own file): the saved and pushed model is the trained adapter."""
        super().save_model(output_dir, _internal_call)
        if getattr(self, "reference_reset", None) is not None and self.args.should_save:
            self.reference_reset.leave_adapter_out(output_dir or self.args.output_dir)

    # ------------------------------------------------------------------ TRL private override 9 of 10
    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and getattr(self, "rollout", None) is not None:
            if getattr(self, "async_rollouts", None) is not None:
                self.async_rollouts.restore(checkpoint)
            self.rollout.restore(checkpoint)
            if self.reference_reset is None:  # resets turned off: a reference the run had reset is still its state
                self.reference_reset = reference_kept_on_resume(self, checkpoint)
                if self.reference_reset is not None:
                    self.add_callback(self.reference_reset)
            if self.reference_reset is not None:
                self.reference_reset.restore(checkpoint)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """``Trainer.train``, where ``resume_from_checkpoint=True`` takes the newest *complete* checkpoint of
        ``output_dir`` (one cut off mid-write is passed over with a warning) instead of the highest-numbered folder."""
        if resume_from_checkpoint is True:
            folder, skipped = last_complete_checkpoint(self.args.output_dir)
            for passed_over, problem in skipped:
                warnings.warn(
                    f"resume_from_checkpoint=True passes over {passed_over}: {problem}. "
                    + (f"Resuming from {folder} instead." if folder is not None else ""),
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            if folder is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
            resume_from_checkpoint = str(folder)
        elif isinstance(resume_from_checkpoint, str) and (damaged := damaged_weight_files(resume_from_checkpoint)):
            raise ValueError(
                f"Cannot resume from {resume_from_checkpoint}: {damaged[0]} is damaged ({damaged[1]}). Resume from "
                "an earlier checkpoint, or with resume_from_checkpoint=True, which passes over damaged ones."
            )
        rollouts = getattr(self, "async_rollouts", None)
        if rollouts is not None:
            rollouts.start_fresh()  # a resumed run then restores the checkpoint's pipeline over it
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            if rollouts is not None and rollouts.pipeline is not None:
                rollouts.pipeline.close()  # also when train() raised: its generator would sample on for nothing

    def sampling_state_dict(self) -> dict[str, Any]:
        """The sampling state a checkpoint keeps: retired prompts, the dynamic-sampling prompt stream and the epoch the
        prompt sampler is in (see ``algorithms.prompt_sampling.PromptState``)."""
        return self.rollout.state_dict()

    def load_sampling_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore :meth:`sampling_state_dict`'s output; returns what was re-derived because the dataset changed."""
        return self.rollout.load_state_dict(state)

    @torch.no_grad()
    def behaviour_logps(self, output) -> torch.Tensor:
        """Log-probabilities of the sampled tokens under the policy that generated them (the model now)."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        forward_kwargs = {key: output[key] for key in FORWARD_KEYS if key in output}
        with activation_checkpointing_disabled(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size
                if self.model.training
                else self.args.per_device_eval_batch_size,
                **forward_kwargs,
            )
        return logps

    # ------------------------------------------------------------------ TRL private override 10 of 10
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        mask = loss_tokens(inputs)
        if "row_active" in inputs:  # groups dropped by group selection: no loss, no metrics
            mask = mask * inputs["row_active"].unsqueeze(1)
        per_token_logps, entropies, topk_logps, aux_loss = self._policy_forward(model, inputs)
        inputs = self._with_loss_side_correction(inputs, per_token_logps, mode)
        entropy_mask = (
            self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            if self.top_entropy_quantile < 1.0
            else None
        )
        per_token_loss, per_token_kl, stats = self._per_token_objective(
            inputs, per_token_logps, topk_logps, mask, entropy_mask
        )
        weights, scale = self._loss_weights_and_scale(inputs, mask, mode)
        loss = aggregate_loss(per_token_loss, mask, weights=weights) * scale
        policy_loss = loss.detach()
        if self._entropy_bonus_enabled:
            loss = loss - self._entropy_bonus(entropies, mask if entropy_mask is None else mask * entropy_mask, mode)
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())
        self._log_loss_metrics(mode, mask, entropies, stats, policy_loss, per_token_kl, inputs.get("row_active"))
        return loss

    def _with_loss_side_correction(self, inputs, per_token_logps, mode: str) -> dict:
        """``inputs`` with the correction's weight built in the loss where it is (``ImportanceCorrection.loss_side``)."""
        return self.correction.loss_side(inputs, per_token_logps, mode)

    def _loss_weights_and_scale(self, inputs, mask, mode: str) -> tuple[torch.Tensor, float]:
        """The weights ``w_i`` of this micro-batch's rows and the factor on ``sum_i w_i sum_t l_it m_it``.

        ``w_i`` were fixed on the whole generation batch. Gradient accumulation sums micro-batch gradients and DDP
        averages over processes, so the factor makes one optimizer step follow the gradient of that batch's loss
        (scaled by steps_per_generation / GA when one generation batch feeds several optimizer steps, as TRL does).
        An aggregation registered ``per_micro_batch`` (TRL's bnpo) takes its weights from this micro-batch and is only
        divided by the accumulation steps, as TRL does."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        aggregation = self.args.loss_aggregation
        if AGGREGATIONS.traits(aggregation).per_micro_batch:
            weights = completion_weights(
                mask.sum(dim=1), aggregation, self.num_generations, self.args.max_completion_length
            )
            return weights, 1.0 / accumulation
        scale = float(self.accelerator.num_processes)
        if mode == "train":
            scale *= self.args.steps_per_generation / accumulation
        return inputs["loss_weights"], scale

    def _per_token_objective(self, inputs, per_token_logps, topk_logps, mask, entropy_mask):
        """The configured policy loss per token, with TRL's token masks and (unless it is in the reward or in the
        estimator's per-token return) TRL's k3 KL term. Returns ``(per_token_loss, per_token_kl or None, the loss's
        stats)``."""
        args = self.args
        advantages = inputs["advantages"].unsqueeze(1) if inputs["advantages"].dim() == 1 else inputs["advantages"]
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:  # on-policy: TRL skips the extra forward, the ratio is 1 with a gradient
            old_per_token_logps = per_token_logps.detach()
        stats: dict[str, torch.Tensor] = {}
        sampler = inputs.get("sampling_per_token_logps")
        # a loss anchored to the sampler takes its ratio against mu itself (verl's bypass mode)
        denominator = self.correction.ratio_denominator(old_per_token_logps, sampler)
        per_token_loss = compute_policy_loss(
            args.policy_loss,
            per_token_logps,
            denominator,
            advantages,
            mask,
            stats=stats,
            **self._policy_loss_kwargs(inputs, topk_logps),
        )
        per_token_loss = self._apply_trl_token_masks(
            per_token_loss, inputs, per_token_logps, old_per_token_logps, advantages, mask, entropy_mask
        )
        # the spread of pi_theta / mu, the ratio CISPO and DPPO weight by (TRL's sampling/* metrics are not made)
        self.correction.sampler_ratio_stats(per_token_logps, sampler, stats)
        # beta's KL is in the reward (RLOO) or in each token's return (REINFORCE++'s estimators): not in the loss too
        if self.beta == 0.0 or args.kl_in_reward or ADVANTAGE_ESTIMATORS.traits(args.advantage_estimator).kl_in_return:
            return per_token_loss, None, stats
        per_token_kl = k3_kl(
            inputs["ref_per_token_logps"],
            per_token_logps,
            old_per_token_logps,
            mask,
            bias_correction=args.use_bias_correction_kl,
            sequence_level=args.importance_sampling_level == "sequence",
        )
        kl_term = self.beta * per_token_kl
        if self.vllm_importance_sampling_mode == ICEPOP_MODE and "importance_sampling_ratio" in inputs:
            kl_term = kl_term * (inputs["importance_sampling_ratio"] > 0)  # IcePop: a masked token has no gradient
        return per_token_loss + kl_term, per_token_kl, stats

    def _policy_forward(self, model, inputs):
        """The current policy's sampled-token log-probs, entropies, log-probs at the stored rollout top-K ids (only
        when the loss needs them) and MoE aux loss."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        if self._uses_topk_divergence:
            return self.topk_forward.forward(
                model,
                input_ids,
                attention_mask,
                completion_ids,
                inputs["rollout_topk_ids"],
                self.aux_loss_enabled,
                model_inputs(inputs),
            )
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in FORWARD_KEYS},
        )
        return logps, entropies, None, aux_loss

    def _apply_trl_token_masks(self, per_token_loss, inputs, logps, old_logps, advantages, mask, entropy_mask):
        """TRL's per-token options on any objective, as TRL applies them: the off-policy mask, the high-entropy mask
        and the vLLM importance-sampling correction (not for a loss whose ratio is already taken against the rollout
        engine: that would count the vLLM mismatch twice)."""
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_logps),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if (
            "importance_sampling_ratio" in inputs  # TRL's correction is on and the batch was sampled by vLLM or late
            and self._uses_trl_is_ratio()
            and not POLICY_LOSSES.traits(self.args.policy_loss).own_is_correction  # VESPO: in its weight
        ):
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        return per_token_loss

    def _uses_trl_is_ratio(self) -> bool:
        """Whether the loss uses TRL's vLLM importance-sampling ratio (``correction.uses_trl_is_ratio``)."""
        return uses_trl_is_ratio(self.args)

    # ------------------------------------------------------------------ non-finite loss guard
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.model.training:
            # Every process joins the reduction, so all of them skip the same optimizer steps.
            bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=loss.device)
            self._nonfinite_guard.record(self.accelerator.reduce(bad, reduction="sum").item() > 0)
        return loss

    def create_optimizer(self, *args, **kwargs):
        """The Trainer's optimizer, whose ``step`` is skipped when the step's loss was NaN or infinite."""
        return self._nonfinite_guard.install(
            super().create_optimizer(*args, **kwargs),
            step_number=lambda: self.state.global_step + 1,
            # looked up at each skip: TRL clears its metric lists after every log
            on_skip=lambda skipped: self._metrics["train"]["nonfinite_loss/skipped_steps"].append(float(skipped)),
        )

    def _policy_loss_kwargs(self, inputs, topk_logps: torch.Tensor | None = None) -> dict[str, Any]:
        """The config values and inputs the chosen policy loss takes (matched by parameter name); its own config
        fields reach it through the fields its registration declares."""
        args = self.args
        available = {
            "epsilon_low": self.epsilon_low,
            "epsilon_high": self.epsilon_high,
            "delta": args.delta,
            "rollout_logps": inputs.get("sampling_per_token_logps"),
            "rollout_topk_logps": inputs.get("rollout_topk_logps"),
            "topk_logps": topk_logps,
            "importance_sampling_level": args.importance_sampling_level,
            "importance_sampling_ratio": inputs.get("importance_sampling_ratio"),
            # the loss's own fields (DPPO's dppo_*, SAPO's sapo_*, ...), as its registration declares them
            **POLICY_LOSSES.config_kwargs(args.policy_loss, args),
        }
        return POLICY_LOSSES.kwargs_for(args.policy_loss, available)

    def _entropy_bonus(self, entropies, effective_mask, mode) -> torch.Tensor:
        """TRL's entropy bonus ``coef * H`` (static or adaptive coefficient), H the micro-batch's mean entropy."""
        args = self.args
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        mean_entropy = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        coef = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > args.entropy_target:
            coef = 0.0
        if self.use_adaptive_entropy and mode == "train":
            window = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            self._entropy_window_stats = (
                window if self._entropy_window_stats is None else self._entropy_window_stats + window
            )
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                self._last_world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                step = (
                    args.entropy_coef_delta
                    if self._last_world_entropy <= args.entropy_target
                    else -args.entropy_coef_delta
                )
                self.entropy_coef = min(max(self.entropy_coef + step, args.entropy_coef_min), args.entropy_coef_max)
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coef * mean_entropy

    def _log_loss_metrics(self, mode, mask, entropies, stats, policy_loss, per_token_kl, row_active=None) -> None:
        """Metrics of one micro-batch, averaged over processes in one collective (every rank passes the same keys);
        a per-sequence metric (GSPO's clip fractions) over the rows that train (``row_active``)."""
        values = {"entropy": entropies}
        if per_token_kl is not None:
            values["kl"] = per_token_kl
        values.update((key, stats[key]) for key in sorted(stats))
        if "clip_ratio/low_mean" in stats and "clip_ratio/high_mean" in stats:
            values["clip_ratio/region_mean"] = stats["clip_ratio/low_mean"] | stats["clip_ratio/high_mean"]
        means = masked_means_over_processes(
            values,
            mask,
            lambda totals: self.accelerator.reduce(totals, reduction="sum"),
            per_process={"policy_loss": policy_loss},
            active_rows=row_active,
        )
        for key, value in means.items():
            self._metrics[mode][key].append(value)
        if mode == "train" and "kl" in means and getattr(self, "reference_reset", None) is not None:
            self.reference_reset.observe_kl(means["kl"])  # its KL trigger reads the KL of each rollout batch
