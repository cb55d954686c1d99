"""The TRL-API guard: every private ``GRPOTrainer`` method ``trainer/base.py`` overrides or calls, every TRL function
and attribute the package relies on, and the checks that fail loudly, by name, when an installed TRL (or
transformers) no longer matches.

``TRL_PRIVATE_API`` lists the private methods, with the parameter names checked against ``TRL_CHECKED_VERSION``;
``check_trl_private_api`` (run when a trainer is built and by a test) names each one that changed. Every
``GRPOTrainer`` attribute the package reads or writes is in ``TRL_INSTANCE_ATTRIBUTES`` (or, set by TRL for one
generation backend only, ``TRL_VLLM_INSTANCE_ATTRIBUTES`` / ``TRL_GENERATE_INSTANCE_ATTRIBUTES``), checked in TRL's
``__init__`` source by ``check_trl_private_api`` and on the built trainer. The trainer's parts (the rollout, the
asynchronous rollouts, the importance-sampling correction, DPPO's top-K forward) read the trainer through their
``Protocol``s, checked on the built trainer by :func:`check_rollout_host`.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any

from packaging.version import Version
from trl import GRPOTrainer

from ..async_rollouts.protocols import missing_members
from ..async_rollouts.server_generator import SAMPLING_ATTRIBUTES

#: The TRL releases this package is tested against (also pinned in pyproject.toml).
SUPPORTED_TRL = (Version("1.16.0"), Version("1.17.0"))
TRL_CHECKED_VERSION = "1.16.0"

#: Every private (or semi-private) ``GRPOTrainer`` method ``trainer/base.py`` overrides or calls, with the leading
#: parameter names (after ``self``) it relies on. Checked against TRL 1.16.0. The overrides come first, in the order
#: ``trainer/base.py`` defines them: the banner "TRL private override N of ..." above each is this list's N-th entry.
TRL_PRIVATE_API: dict[str, tuple[str, ...]] = {
    # overridden here, in file order (banners 1 to 10)
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "_generate": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations"),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ),
    "_prepare_inputs": ("generation_batch",),
    "_get_train_sampler": ("dataset",),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_compute_loss": ("model", "inputs"),
    # called from the overrides
    "get_high_entropy_mask": ("entropies", "mask", "threshold"),
    "get_off_policy_mask": ("advantages", "per_token_logps", "sampling_per_token_logps", "mask"),
    "_get_output_dir": ("trial",),
    "_tokenize_prompts": ("prompts",),
}

#: TRL functions (outside ``GRPOTrainer``) called here as ``GRPOTrainer.__init__`` calls them, with the leading
#: parameter names relied on. Checked against TRL 1.16.0.
TRL_HELPER_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "add_fused_lm_head": ("model", "temperature", "cast_lm_head_to_fp32", "outputs"),
    # multimodal rows: image tensors cut into one entry per row and joined back (dynamic sampling, DPPO top-K)
    "split_pixel_values_by_grid": ("batch",),
    "unsplit_pixel_values_by_grid": ("batch",),
}
#: ``trl.generation.vllm_generation.VLLMGeneration``: the public ``generate`` that DPPO top-K wraps on
#: ``GRPOTrainer.vllm_generation`` (its leading parameters and its 4-tuple ``(prompt_ids, completion_ids, logprobs,
#: logprob_token_ids)``), and the ``logprobs`` setting it reads at each call. Checked against TRL 1.16.0.
TRL_VLLM_GENERATION: dict[str, tuple[str, ...]] = {
    "generate": ("prompts", "images", "num_generations", "profiler"),
    "sync_weights": (),  # async_generator="server" pushes the behaviour weights with it
}
#: Attributes of ``VLLMGeneration`` read here: DPPO's ``logprobs``; the server client and the sampling settings that
#: ``async_generator="server"`` sends as TRL's ``generate`` sends them (``server_generator.sampling_parameters``).
TRL_VLLM_GENERATION_ATTRIBUTES = ("logprobs", "vllm_client", *SAMPLING_ATTRIBUTES)
#: ``trl.generation.vllm_client.VLLMClient.generate``'s parameters that ``async_generator="server"`` passes.
TRL_VLLM_CLIENT_GENERATE: dict[str, tuple[str, ...]] = {
    "generate": (
        "prompts",
        "features",
        "n",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "logprobs",
        "structured_outputs_regex",
        "generation_kwargs",
    ),
}
#: transformers' private ``GenerationMixin`` methods wrapped here, with their leading parameters: the sampler's
#: log-probabilities are read from ``generate``'s own scores by a processor appended to the list this method builds
#: (``trl_reasoning.async_rollouts.sampler_logps``). Checked against transformers 5.24.0.
TRANSFORMERS_PRIVATE_API: dict[str, tuple[str, ...]] = {
    "_get_logits_processor": ("generation_config", "input_ids_seq_length"),
}
#: The per-token outputs GRPOTrainer asks of its fused LM head (TRL 1.16, ``GRPOTrainer.__init__``).
TRL_FUSED_LM_HEAD_OUTPUTS = ("log_probs", "entropy")

#: ``GRPOTrainer`` instance attributes the package reads or writes (set in TRL's ``__init__`` whatever the generation
#: backend): the overrides', and those of the trainer parts' protocols that come from TRL (``RolloutHost``,
#: ``AsyncRolloutHost``, ``CorrectionHost``, ``TopKForwardHost``).
TRL_INSTANCE_ATTRIBUTES = (
    "_metrics",
    "_logs",
    "beta",
    "num_generations",
    "num_generations_eval",
    "max_completion_length",
    "epsilon_low",
    "epsilon_high",
    "use_vllm",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
    "_step",
    "_buffered_inputs",  # padding-free: the micro-batches of a generation batch, rebalanced by tokens
    "off_policy_mask_threshold",
    "top_entropy_quantile",
    "use_adaptive_entropy",
    "entropy_coef",
    "_entropy_bonus_enabled",
    "_last_world_entropy",
    "_entropy_window_stats",
    "aux_loss_enabled",
    "router_aux_loss_coef",
    "reward_funcs",
    "reward_func_names",
    "reward_weights",
    "_tokenizer",
    "shuffle_dataset",
    "num_iterations",
    "temperature",
    "environment_factories",
    "_is_vlm",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "ref_model",
    # asynchronous rollouts: the processes' sampling settings, and TRL's rollout_func path that decodes a batch
    # sampled ahead
    "eos_token_ids",
    "pad_to_multiple_of",
    "rollout_func",
)


#: ``GRPOTrainer`` instance attributes set only when ``use_vllm`` and read then (by ``topk_forward``, for DPPO's engine
#: top-K, ``TopKEngineHost``; by asynchronous rollouts, ``VLLMBackendHost``, which also write ``_last_loaded_step`` to
#: make TRL sync).
TRL_VLLM_INSTANCE_ATTRIBUTES = ("vllm_generation", "vllm_mode", "_last_loaded_step")
#: ``GRPOTrainer`` instance attributes set only without vLLM (HF ``generate`` samples) and read then, by asynchronous
#: rollouts that sample outside TRL's ``_generate`` (``GenerateBackendHost``).
TRL_GENERATE_INSTANCE_ATTRIBUTES = ("generation_config", "generation_kwargs")


#: The per-rollout tool tables (name -> callable) ``GRPOTrainer._generate_and_score_completions`` builds for each batch
#: and its tool loop calls: ``trainer/tool_calls.py`` wraps their callables (a timeout, failures named).
TRL_TOOL_TABLES = ("_sync_tool_dicts", "_async_tool_dicts")
#: ``GRPOTrainer`` instance attributes set only with ``environment_factory`` (``EnvironmentHost``): a generator that
#: samples ahead starts a batch's episodes at its submission and lends their instances to TRL's scoring through them.
TRL_ENVIRONMENT_ATTRIBUTES = ("_multi_environment", "_environment_pool")
#: Set by ``GRPOTrainer._generate_and_score_completions`` for each batch with environments and read by its
#: ``_tokenize_prompts`` (each row's environment, hence the tools its prompt is rendered with): written here while a
#: batch sampled ahead is tokenized at its submission.
TRL_BATCH_ENVIRONMENTS = "_batch_environments"


def trl_instance_attributes(use_vllm: bool) -> tuple[str, ...]:
    """The ``GRPOTrainer`` instance attributes a trainer with this generation backend must have."""
    backend = TRL_VLLM_INSTANCE_ATTRIBUTES if use_vllm else TRL_GENERATE_INSTANCE_ATTRIBUTES
    return TRL_INSTANCE_ATTRIBUTES + backend


def trl_attribute_problems(init_source: str) -> list[str]:
    """The guarded instance attributes that ``GRPOTrainer.__init__`` (its source, ``init_source``) no longer sets."""
    every = (
        TRL_INSTANCE_ATTRIBUTES
        + TRL_VLLM_INSTANCE_ATTRIBUTES
        + TRL_GENERATE_INSTANCE_ATTRIBUTES
        + TRL_ENVIRONMENT_ATTRIBUTES
    )
    return [
        f"GRPOTrainer.__init__ no longer sets self.{name}"
        for name in every
        if not re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?(?:,\s*self\.\w+\s*)*=(?!=)", init_source)
    ]


def check_rollout_host(trainer: Any, *protocols: type) -> None:
    """Raise :class:`TRLCompatibilityError` naming every member of ``protocols`` (the trainer parts' seams:
    ``RolloutHost``, ``AsyncRolloutHost`` and its backend's, ``CorrectionHost``, ``TopKForwardHost`` and, with vLLM,
    ``TopKEngineHost``) that ``trainer`` lacks."""
    problems = [f"{protocol.__name__}.{name}" for protocol in protocols for name in missing_members(trainer, protocol)]
    if problems:
        raise TRLCompatibilityError(
            f"{type(trainer).__name__} lacks {', '.join(problems)}, which trl-reasoning's rollout parts read: the "
            f"installed TRL or transformers no longer sets them (checked against TRL {TRL_CHECKED_VERSION})."
        )


class TRLCompatibilityError(RuntimeError):
    """The installed TRL no longer has a private method or attribute that trl-reasoning relies on."""


def _signature_problems(owner: str, namespace: Any, expected_parameters: dict[str, tuple[str, ...]]) -> list[str]:
    """What no longer matches: each ``namespace.name`` must exist and its parameters (after ``self``) start with
    ``expected_parameters[name]``."""
    problems = []
    for name, expected in expected_parameters.items():
        function = getattr(namespace, name, None)
        if function is None:
            problems.append(f"{owner}.{name} no longer exists")
            continue
        params = [p for p in inspect.signature(function).parameters if p != "self"]
        if tuple(params[: len(expected)]) != expected:
            problems.append(
                f"{owner}.{name} takes ({', '.join(params)}), expected it to start with ({', '.join(expected)})"
            )
    return problems


def check_trl_private_api(trainer_class: type = GRPOTrainer) -> None:
    """Raise :class:`TRLCompatibilityError` naming every entry of ``TRL_PRIVATE_API`` that ``trainer_class`` lacks or
    whose leading parameters changed (likewise ``TRL_HELPER_FUNCTIONS`` and ``TRL_VLLM_GENERATION``), and every
    guarded instance attribute that TRL's ``GRPOTrainer.__init__`` no longer sets (and the tool tables its scoring
    sets, ``TRL_TOOL_TABLES`` and ``TRL_BATCH_ENVIRONMENTS``)."""
    import trl
    import trl.trainer.utils as trl_utils
    from transformers.generation.utils import GenerationMixin
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    problems = _signature_problems(trainer_class.__name__, trainer_class, TRL_PRIVATE_API)
    problems += _signature_problems("trl.trainer.utils", trl_utils, TRL_HELPER_FUNCTIONS)
    problems += _signature_problems("VLLMGeneration", VLLMGeneration, TRL_VLLM_GENERATION)
    problems += _signature_problems("VLLMClient", VLLMClient, TRL_VLLM_CLIENT_GENERATE)
    problems += _signature_problems("transformers GenerationMixin", GenerationMixin, TRANSFORMERS_PRIVATE_API)
    problems += trl_attribute_problems(inspect.getsource(GRPOTrainer.__init__))
    scoring_source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for attribute in (*TRL_TOOL_TABLES, TRL_BATCH_ENVIRONMENTS):
        if f"self.{attribute} =" not in scoring_source:
            problems.append(f"GRPOTrainer._generate_and_score_completions no longer sets self.{attribute}")
    if f"self.{TRL_BATCH_ENVIRONMENTS}" not in inspect.getsource(GRPOTrainer._tokenize_prompts):
        problems.append(f"GRPOTrainer._tokenize_prompts no longer reads self.{TRL_BATCH_ENVIRONMENTS}")
    class_source = inspect.getsource(VLLMGeneration)
    for attribute in TRL_VLLM_GENERATION_ATTRIBUTES:
        if f"self.{attribute} =" not in class_source:
            problems.append(f"VLLMGeneration no longer sets self.{attribute}")
    if problems:
        raise TRLCompatibilityError(
            f"trl-reasoning was checked against TRL {TRL_CHECKED_VERSION}, but the installed TRL {trl.__version__} "
            "changed private methods it overrides or calls:\n  - " + "\n  - ".join(problems) + "\nInstall a "
            f"supported TRL: pip install 'trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}'."
        )


def warn_if_trl_unsupported() -> None:
    import trl

    version = Version(trl.__version__)
    if not SUPPORTED_TRL[0] <= version < SUPPORTED_TRL[1]:
        warnings.warn(
            f"trl-reasoning supports trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}, but trl {version} is installed. "
            f"Install a supported version: pip install 'trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}'.",
            stacklevel=2,
        )
