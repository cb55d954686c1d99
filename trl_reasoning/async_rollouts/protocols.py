"""The named seams of asynchronous rollouts: what they need from the trainer, what a generator is, how weights travel.

Three seams, each a ``typing.Protocol`` (or a small value type) that the code on both sides is written against:

- **The host** (:class:`AsyncRolloutHost`, with :class:`VLLMBackendHost` when ``use_vllm`` and
  :class:`GenerateBackendHost` without it): every method and attribute ``trl_reasoning.async_rollouts`` (the
  ``AsyncRollouts`` facade, its checks and its generators) reads from or writes to the trainer. The trainer's own
  methods it lends (``trl_generate``, ``behaviour_logps``, ``tokenize_prompts``), ``transformers.Trainer``'s state,
  and ``GRPOTrainer``'s: the members that come from TRL are in the trainer's TRL-API guard
  (``trl_reasoning.trainer.trl_api``), which fails by name when a TRL release drops one.
- **The generator** (:class:`Generator`): what samples a :class:`GenerationJob` ahead of the trainer, in the training
  process (``InProcessGenerator``), a worker process (``GeneratorProcess``) or TRL's vLLM server
  (``ServerGenerator``). The pipeline holds one through this type only.
- **The weights** (:class:`VersionedWeights`, :class:`WeightTransport`): a job's behaviour weights carry their version,
  the generation step whose weights they are. A transport makes its engine hold a job's weights and ships them only
  when their version differs from the one the engine holds: a swap into the trainer's own model (in-process), a
  shared-memory block for the worker (process), TRL's weight sync (server). Object identity decides nothing, so a
  copy of the same weights is never shipped twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch


@dataclasses.dataclass(frozen=True)
class VersionedWeights:
    """Behaviour weights with their version: ``tensors`` (trainable parameter name -> tensor) are the trainable
    weights the model held at generation step ``version``. Two ``VersionedWeights`` of one run with the same version
    hold the same values, whichever objects carry them (the live parameters, a CPU snapshot, a converted copy)."""

    version: int
    tensors: Mapping[str, torch.Tensor]


@dataclasses.dataclass
class GenerationJob:
    """One batch to sample: ``prompt_ids`` (this process's rows), the behaviour weights, the seed. The rows of a
    batch's first turn are its prompts, each repeated ``num_generations`` times (one completion per row, sampled per
    prompt where an engine can); those of a later turn (``later_turn``) are each rollout's own history so far, one
    completion each."""

    step: int
    prompt_ids: list[list[int]]
    weights: VersionedWeights
    seed: int
    later_turn: bool = False


class GeneratorError(RuntimeError):
    """A generator failed, died or did not answer in time (a worker process, a vLLM server's request)."""


#: What a generator returns for a step: ``(completion ids, sampled-token log-probs, seconds the generator spent on
#: them, seconds the caller waited for them)``.
GeneratorResult = tuple[list[list[int]], list[list[float]], float, float]


@runtime_checkable
class Generator(Protocol):
    """What samples the batches of :class:`~trl_reasoning.async_rollouts.pipeline.AheadPipeline` ahead of the trainer.

    ``submit`` a job (once per step: a step already submitted is ignored), ``result(step)`` waits for it, ``release``
    before the trainer's own generation (a vLLM server answers what it was sent first; elsewhere nothing to do),
    ``close`` stops it. ``last_ranked`` is the engine's own top-K of the batch ``result`` last returned (DPPO with a
    vLLM server), ``None`` elsewhere."""

    submitted: set[int]
    last_ranked: tuple[list, list, list] | None

    def submit(self, job: GenerationJob) -> None: ...

    def result(self, step: int) -> GeneratorResult: ...

    def release(self) -> None: ...

    def close(self) -> None: ...

    @property
    def alive(self) -> bool:
        """Whether it can still answer (a worker process that died cannot)."""
        ...


@runtime_checkable
class WeightTransport(Protocol):
    """How one generator's engine comes to hold a job's behaviour weights.

    Within ``holding(weights)`` the engine samples with ``weights``; the transport ships them only when
    ``weights.version`` is not ``held_version`` (``None``: unknown, the next ``holding`` ships). ``forget`` is called
    when something else changed the engine's weights (TRL's own sync to a vLLM server)."""

    @property
    def held_version(self) -> int | None: ...

    def holding(self, weights: VersionedWeights) -> AbstractContextManager[Any]: ...

    def forget(self) -> None: ...


class VersionGate:
    """The version bookkeeping a transport whose engine keeps its weights between jobs shares (a worker process, a
    vLLM server): ``ship`` is called with a job's weights only when their version differs from the last shipped."""

    def __init__(self, ship: Callable[[VersionedWeights], None]):
        self._ship = ship
        self._held: int | None = None

    @property
    def held_version(self) -> int | None:
        return self._held

    def update(self, weights: VersionedWeights) -> bool:
        """Ship ``weights`` if their version is not the one held; returns whether they were shipped."""
        if weights.version == self._held:
            return False
        self._held = None  # a ship that raises leaves the engine's weights unknown
        self._ship(weights)
        self._held = weights.version
        return True

    def forget(self) -> None:
        self._held = None


# --------------------------------------------------------------------------------------------------------- the host
@runtime_checkable
class AsyncRolloutHost(Protocol):
    """What :class:`~trl_reasoning.async_rollouts.pipeline.AsyncRollouts` reads from (and, where marked, writes to) its
    trainer, whatever the generation backend. Members from ``GRPOTrainer.__init__`` are in the trainer's TRL-API guard
    (``TRL_INSTANCE_ATTRIBUTES``); those of :class:`VLLMBackendHost` and :class:`GenerateBackendHost` exist only with
    their backend."""

    # lent by trl-reasoning's trainer
    def trl_generate(self, prompts: list) -> tuple: ...

    def behaviour_logps(self, output: dict) -> torch.Tensor: ...

    def tokenize_prompts(self, prompts: list) -> list[list[int]]: ...

    rollout: Any  # trainer.rollout.Rollout: ``generates_extra_rounds``
    _engine_topk: list | None  # DPPO's top-K of vLLM (written: the server's appended)

    @property
    def _uses_topk_divergence(self) -> bool: ...

    # transformers.Trainer's
    args: Any
    model: torch.nn.Module
    model_wrapped: torch.nn.Module
    accelerator: Any
    is_fsdp_enabled: bool
    is_deepspeed_enabled: bool

    def add_callback(self, callback: Any) -> None: ...

    # GRPOTrainer's (TRL_INSTANCE_ATTRIBUTES)
    use_vllm: bool  # written: True while TRL scores an asynchronous batch, False while it decodes one sampled ahead
    rollout_func: Callable | None  # written: the batch sampled ahead, while TRL decodes it
    _metrics: dict
    _tokenizer: Any
    _is_vlm: bool
    tools: list
    environment_factories: dict | None
    num_generations: int
    num_iterations: int
    temperature: float
    eos_token_ids: list[int]
    pad_to_multiple_of: int | None


@runtime_checkable
class VLLMBackendHost(Protocol):
    """:class:`AsyncRolloutHost`'s members that ``GRPOTrainer`` sets only with ``use_vllm=True``
    (``TRL_VLLM_INSTANCE_ATTRIBUTES``)."""

    vllm_generation: Any
    vllm_mode: str
    _last_loaded_step: int  # written: -1 makes TRL sync its engine before it samples again


@runtime_checkable
class EnvironmentHost(Protocol):
    """:class:`AsyncRolloutHost`'s members that ``GRPOTrainer`` sets only with ``environment_factory``
    (``TRL_ENVIRONMENT_ATTRIBUTES``), read by a generator that samples ahead to start each batch's episodes at its
    submission (``trl_reasoning.async_rollouts.episodes``)."""

    _multi_environment: bool  # whether each row's ``environment`` field picks its environment
    _environment_pool: dict  # written: a batch's own instances, while TRL scores it
    # also written, while a batch is tokenized at its submission: ``_batch_environments`` (each row's environment, by
    # which TRL's ``_tokenize_prompts`` renders its tools), which TRL sets per batch, not in ``__init__``
    # (``TRL_BATCH_ENVIRONMENTS``)


@runtime_checkable
class GenerateBackendHost(Protocol):
    """:class:`AsyncRolloutHost`'s members that ``GRPOTrainer`` sets only without vLLM, where HF ``generate`` samples
    (``TRL_GENERATE_INSTANCE_ATTRIBUTES``)."""

    generation_config: Any
    generation_kwargs: dict


def missing_members(host: object, protocol: type) -> list[str]:
    """The members of ``protocol`` (a ``Protocol`` class) that ``host`` lacks, in the protocol's order."""
    return [name for name in protocol_members(protocol) if not hasattr(host, name)]


def protocol_members(protocol: type) -> list[str]:
    """Every method, property and attribute a ``Protocol`` class names (its own and its protocol bases')."""
    names: list[str] = []
    for klass in reversed(protocol.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False) or klass is Protocol:
            continue
        for name in [*getattr(klass, "__annotations__", {}), *vars(klass)]:
            special = name.startswith("__") or name.startswith("_abc_") or name in _PROTOCOL_INTERNALS
            if not special and name not in names:
                names.append(name)
    return names


_PROTOCOL_INTERNALS = {"_is_protocol", "_is_runtime_protocol"}
