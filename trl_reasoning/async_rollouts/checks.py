"""The checks of an asynchronous run: whether it can sample asynchronously at all (:func:`async_rollouts_problem`,
:func:`resolve_async_rollouts`), what its generator cannot sample (:func:`generator_refusal`), and whether it keeps
snapshots of its weights or the sampled batches (:func:`snapshots_needed_by`). The generators' rules are their
declarations' (``trl_reasoning.async_generators``), read on the run as :func:`ahead_run` describes it.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..async_generators import GENERATORS, AheadRun
from ..utils.user_warnings import user_stacklevel
from .protocols import AsyncRolloutHost


def async_rollouts_problem(*, sharded: bool, vision_language: bool, uses_vllm: bool) -> str | None:
    """Why a run cannot sample asynchronously (``None``: it can)."""
    if sharded:
        return (
            "asynchronous rollouts keep snapshots of the trainable weights and swap them into the model to sample; "
            "with FSDP or DeepSpeed ZeRO-3 each process holds only a shard of them (use ZeRO-1/2 or LoRA)"
        )
    if vision_language and not uses_vllm:
        return (
            "asynchronous rollouts record the sampler's log-probabilities at generation time; for a vision-language "
            "model that needs vLLM (use_vllm=True), which returns them"
        )
    return None


def resolve_async_rollouts(requested: bool | None, problem: str | None, config_class: type) -> bool:
    """Whether a run samples asynchronously: ``async_rollouts=True`` where it cannot is an error; ``None`` (a preset's
    "where the run supports it") falls back to synchronous with a warning that says why (and whose default it was,
    where ``config_class`` declares ``None`` as its default)."""
    if requested is False:
        return False
    if problem is None:
        return True
    problem = problem.rstrip(".")
    if requested is True:
        raise ValueError(f"async_rollouts=True: {problem}. Set async_rollouts=False to train synchronously.")
    declared = getattr(config_class, "__dataclass_fields__", {}).get("async_rollouts")
    whose = f" ({config_class.__name__}'s default)" if declared is not None and declared.default is None else ""
    warnings.warn(
        f"async_rollouts=None{whose}: this run trains synchronously, because {problem}. Set "
        "async_rollouts=False to silence this warning.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return False


def snapshots_needed_by(host: AsyncRolloutHost) -> str | None:
    """Why an asynchronous run must keep the last ``k + 1`` snapshots of its trainable weights (``None``: it keeps the
    sampled batches instead). Sampling batch ``g + k`` at step ``g`` needs its prompts then and one sampling call per
    batch; what samples or scores a batch of step ``g`` only at step ``g``, with the weights of ``g - k``, needs those
    weights kept until then:

    - dynamic sampling's extra rounds (their prompts and sizes follow round 0's rewards);
    - DPPO's top-K from the model (a forward of the trained batch with the behaviour weights);
    - what the generator leaves to TRL's own generation (its declaration's ``trl_samples_where``:
      ``async_generator="inline"`` where TRL's own ``_generate`` samples); ``max_staleness=0`` keeps no snapshot anyway.
    """
    args = host.args
    if args.max_staleness == 0:
        return "max_staleness=0 (no snapshot is kept)"
    if host.rollout.generates_extra_rounds:
        return "dynamic sampling's extra rounds are sampled by the weights of k steps earlier after round 0's rewards"
    if host._uses_topk_divergence and not host.use_vllm:
        return "DPPO's top-K divergence is computed from the model with the behaviour weights"
    reason = GENERATORS.get(args.async_generator).step_time_reason(ahead_run(host))
    if reason is None and host.tools:
        return "tool calls: the turns after the first are sampled when the batch is trained, by the weights of k steps earlier"
    return reason


def ahead_run(host: AsyncRolloutHost) -> AheadRun:
    """``host``'s run as the generators' rules read it: what its config says, and what only the trainer knows."""
    return dataclasses.replace(
        AheadRun.of_config(host.args),
        num_iterations=host.num_iterations,
        uses_vllm=host.use_vllm,
        vllm_mode=getattr(host, "vllm_mode", None) if host.use_vllm else None,
        tools=bool(host.tools) or host.environment_factories is not None,
        environments=host.environment_factories is not None,
        vision_language=host._is_vlm,
        quantized=getattr(host.model, "is_loaded_in_4bit", False) or getattr(host.model, "is_loaded_in_8bit", False),
        rollout_func=host.rollout_func is not None,
        processes=host.accelerator.num_processes,
        engine_topk=host.use_vllm and host._uses_topk_divergence,
    )


def generator_refusal(host: AsyncRolloutHost) -> str | None:
    """What of ``host``'s run its generator cannot sample as TRL's ``_generate`` would, each named with its way out
    (``None``: it can sample all of it). Everything else TRL's generation reads (``generation_kwargs``, ``top_p``,
    ``top_k``, ``min_p``, ``repetition_penalty``, ``cache_implementation``, the chat template and its kwargs) reaches
    the worker through the trainer's ``generation_config`` and tokenized prompts, or the server through TRL's own
    sampling parameters."""
    return GENERATORS.refusal(host.args.async_generator, ahead_run(host))
