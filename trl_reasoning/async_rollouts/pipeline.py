"""Rollouts with a deterministic staleness bound (PipelineRL-k, ScaleRL §3.1): the behaviour policy's weights.

With ``async_rollouts=True`` and ``max_staleness=k`` the batch of generation step ``g`` is sampled from the weights
the policy had at generation step ``g - k`` (the first ``k`` batches from the initial weights), whatever the timing:
the staleness of every batch is ``min(g, k)`` generation steps. That is what a pipeline with ``k`` batches in flight
trains on, written so that a run is reproducible and resumes exactly. Three policies then meet in the loss:

- ``mu``, the behaviour policy that sampled (the weights of step ``g - k``); its log-probabilities are recorded at
  generation time (TRL's ``sampling_per_token_logps``), from the generator's own weights;
- ``pi_old``, the trainer's weights when the batch is trained (TRL's ``old_per_token_logps``);
- ``pi_theta``, the weights being optimised.

Memory is O(k sampled batches), not O(k copies of the weights): :class:`AheadPipeline` samples each batch as soon as
its behaviour weights exist (the batch of step ``g + k`` at step ``g``, read ahead from the dataloader, with the
weights the model holds then: in the training process, a worker process or a vLLM server) and keeps the sampled
batches, in RAM and in checkpoints, until their step trains on them. :class:`BehaviourWeights` keeps a snapshot of
the trainable parameters (a LoRA run's adapters) only where a batch cannot be sampled ahead: the next epoch's first
batches, the first batch after ``train()``, and, as the last ``k + 1`` snapshots swapped into the model around TRL's
own generation, the features that sample or score a batch of step ``g`` only at step ``g``
(:func:`snapshots_needed_by`).

Seams (``trl_reasoning.async_rollouts.protocols``): :class:`AsyncRollouts` reads and writes its trainer only through
the members ``AsyncRolloutHost`` names (with ``VLLMBackendHost`` or ``GenerateBackendHost``); :class:`AheadPipeline`
holds its generator as a ``Generator`` (:class:`InProcessGenerator`, ``GeneratorProcess``, ``ServerGenerator``) and
submits each batch with ``VersionedWeights`` whose version is the generation step the weights are from
(:meth:`BehaviourWeights.versioned_for`); each generator's ``WeightTransport`` ships weights only when that version
changes (:class:`ModelSwap` in the training process).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from transformers import TrainerCallback

from ..algorithms.importance_sampling import weight_share_changed
from ..utils.user_warnings import user_stacklevel
from .process_generator import (
    GeneratorError,
    GeneratorProcess,
    SamplingSettings,
    padded_batch,
    sample,
)
from .protocols import AsyncRolloutHost, GenerationJob, Generator, GeneratorResult, VersionedWeights
from .sampler_logps import completion_logps, sampled_logps_recorded
from .server_generator import ServerGenerator

BEHAVIOUR_WEIGHTS_FILE = "trl_reasoning_behaviour_weights.pt"
#: The asynchronous state's format in that file: the kept snapshots with their steps, and the sampled batches not yet
#: trained on (the earlier format, without a ``format`` key, held the last ``k + 1`` snapshots).
ASYNC_STATE_FORMAT = 2


def rank_batches_file(process_index: int) -> str:
    """The checkpoint file of process ``process_index``'s (> 0) sampled batches (the main process's are in
    ``BEHAVIOUR_WEIGHTS_FILE``)."""
    return f"trl_reasoning_async_batches_rank{process_index}.pt"


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters an optimizer step changes (for a PEFT model, the adapters), by name."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


@contextlib.contextmanager
def weights_swapped_in(params: dict[str, torch.nn.Parameter], weights: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Within the block, ``params`` hold ``weights`` (a snapshot of them); afterwards, exactly what they held before."""
    missing = sorted(set(params) - set(weights))
    if missing:
        raise RuntimeError(
            f"The behaviour policy's snapshot lacks parameters {missing[:5]}: the set of trainable parameters "
            "changed during training, which asynchronous rollouts do not support."
        )
    current = {name: param.detach().clone() for name, param in params.items()}
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name].to(param.device, param.dtype))
    try:
        yield
    finally:
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(current[name])


class ModelSwap:
    """The ``WeightTransport`` of the training process (``async_generator="inline"``, and the model TRL's sync sends
    to a vLLM server): within :meth:`holding` the trainer's own model holds a job's weights, swapped in (and the
    model's own swapped back afterwards) unless their version is the one the model holds now.

    Args:
        params: the model's trainable parameters (:func:`trainable_parameters`).
        model_version: the generation step whose weights the model holds: the last one recorded, as the pipeline
            submits only between a step's recording and its optimizer step (``None`` before the first).
    """

    def __init__(self, params: Callable[[], dict[str, torch.nn.Parameter]], model_version: Callable[[], int | None]):
        self._params = params
        self._model_version = model_version

    @property
    def held_version(self) -> int | None:
        return self._model_version()

    @contextlib.contextmanager
    def holding(self, weights: VersionedWeights) -> Iterator[None]:
        if weights.version == self.held_version:
            yield
            return
        with weights_swapped_in(self._params(), weights.tensors):
            yield

    def forget(self) -> None:
        """Nothing is kept: the model's version is read from the trainer at each :meth:`holding`."""


class BehaviourWeights:
    """The behaviour policy of a run with staleness bound ``max_staleness``: the batch of generation step ``g`` is
    sampled by the weights of step ``max(g - k, first)`` (``first``: the step the pipeline started at), and this
    object keeps the snapshots of the trainable weights that a later sampling still needs.

    Two ways to keep them:

    - ``keep_all=True`` (the default): a snapshot at each of the last ``k + 1`` generation steps, and
      :meth:`swapped_in` puts the one of ``g - k`` in the model at step ``g``. What a run needs when it samples a
      batch of step ``g`` only at step ``g`` (dynamic sampling's extra rounds, DPPO's top-K from the model, TRL's own
      generation in the training process): O(k) copies of the trainable weights.
    - ``keep_all=False``: the pipeline samples each batch as soon as its behaviour weights exist (batch ``g + k`` at
      step ``g``, with the weights the model holds then) and keeps the sampled batches instead; a snapshot is kept
      only by :meth:`keep` (weights whose batch cannot be sampled yet: the first ``k`` batches of an epoch, read only
      when the epoch starts) and released by :meth:`release`.

    Args:
        max_staleness: ``k``; ``0`` samples from the current weights (a synchronous run with TRL's importance-sampling
            correction, whose ratio is then exactly 1).
        keep_all: keep the last ``k + 1`` snapshots (see above).
    """

    def __init__(self, max_staleness: int, keep_all: bool = True):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}.")
        self.max_staleness = max_staleness
        self.keep_all = keep_all
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}  # generation step -> its weights (CPU)
        self.generation_steps = 0
        self.first_step = 0  # the step whose weights sampled the pipeline's first batches (a restart moves it)

    def record(self, params: dict[str, torch.Tensor]) -> int:
        """A new generation step, whose weights are ``params``: with ``keep_all`` they are snapshotted (and the ones
        no later step can sample with dropped). Returns the staleness of that step's batch."""
        step = self.generation_steps
        self.generation_steps += 1
        if self.keep_all and self.max_staleness > 0:
            self.keep(step, params)
            for old in [s for s in self._snapshots if s < step - self.max_staleness]:
                del self._snapshots[old]
        return self.staleness

    def keep(self, step: int, params: dict[str, torch.Tensor]) -> None:
        """Snapshot ``params`` as the weights of generation ``step`` (a later batch is sampled with them)."""
        self._snapshots[step] = {name: tensor.detach().to("cpu", copy=True) for name, tensor in params.items()}

    def restart(self, first_step: int) -> None:
        """The pipeline starts again from the weights of generation step ``first_step`` (the current or the next
        one): its batch and the next ``k`` are sampled by them, and no older snapshot is kept."""
        self._snapshots = {step: weights for step, weights in self._snapshots.items() if step == first_step}
        self.first_step = first_step

    def reset(self) -> None:
        """Back to a fresh run's state: no generation step yet, no snapshot (a ``train()`` that does not resume)."""
        self._snapshots = {}
        self.generation_steps = self.first_step = 0

    def release(self, step: int) -> None:
        """Drop the snapshot of generation ``step`` (no batch is left to sample with it)."""
        self._snapshots.pop(step, None)

    @property
    def kept_steps(self) -> list[int]:
        """The generation steps whose weights are kept, oldest first."""
        return sorted(self._snapshots)

    def source_of(self, step: int) -> int:
        """The generation step whose weights sample the batch of generation ``step``."""
        return max(step - self.max_staleness, self.first_step)

    @property
    def staleness(self) -> int:
        """Generation steps between the weights that sample the current batch and the weights training on it."""
        newest = self.generation_steps - 1
        return max(newest - self.source_of(newest), 0)

    @contextlib.contextmanager
    def swapped_in(self, params: dict[str, torch.nn.Parameter]) -> Iterator[int]:
        """Within the block, ``params`` hold the behaviour weights of the current generation step; afterwards, exactly
        what they held before. Yields the staleness."""
        staleness = self.staleness
        if staleness == 0:
            yield 0
            return
        with weights_swapped_in(params, self.weights_for(self.generation_steps - 1)):
            yield staleness

    def weights_for(self, step: int, current: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The behaviour weights of generation step ``step``: the snapshot of its source step
        (:meth:`source_of`), or ``current`` (the model's weights now) when that source is the newest step and no
        snapshot of it is kept."""
        source, newest = self.source_of(step), self.generation_steps - 1
        if source in self._snapshots:
            return self._snapshots[source]
        if source == newest and current is not None:
            return current
        kept = self.kept_steps
        raise LookupError(
            f"the behaviour weights of generation step {step} (the weights of step {source}) are not kept: "
            f"{'the snapshots of steps ' + str(kept) + ' are' if kept else 'no snapshot is'}"
        )

    def versioned_for(self, step: int, current: dict[str, torch.Tensor] | None = None) -> VersionedWeights:
        """:meth:`weights_for`, with their version: the generation step they are from (:meth:`source_of`)."""
        tensors = self.weights_for(step, current)
        return VersionedWeights(self.source_of(step), tensors)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        kept = self.kept_steps
        return {
            "max_staleness": self.max_staleness,
            "generation_steps": self.generation_steps,
            "first_step": self.first_step,
            "snapshot_steps": kept,
            "snapshots": [self._snapshots[step] for step in kept],
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Take ``state``'s snapshots; ``False``, taking nothing, when it was saved with another ``max_staleness``
        (its snapshots are another lag's). A state of the earlier format (the last ``k + 1`` snapshots, without
        their steps) is read as what it was: the snapshots of the steps before ``generation_steps``."""
        if state["max_staleness"] != self.max_staleness:
            return False
        snapshots, generation_steps = list(state["snapshots"]), int(state["generation_steps"])
        steps = state.get("snapshot_steps")
        if steps is None:  # the earlier format: the newest snapshots in order, the oldest the pipeline's first weights
            steps = list(range(generation_steps - len(snapshots), generation_steps))
            first_step = steps[0] if steps else generation_steps
        else:
            first_step = int(state["first_step"])
        self._snapshots = dict(zip((int(step) for step in steps), snapshots, strict=True))
        self.generation_steps, self.first_step = generation_steps, first_step
        return True

    def save(self, folder: str | os.PathLike, extra: dict[str, Any] | None = None) -> None:
        """Write the snapshots (and ``extra``: the sampled batches of a pipeline) into ``folder`` atomically."""
        write_atomically(os.path.join(folder, BEHAVIOUR_WEIGHTS_FILE), {**self.state_dict(), **(extra or {})})

    def load(self, folder: str | os.PathLike) -> bool:
        """Read the snapshots from ``folder``; ``False`` when the file is absent or was saved with another
        ``max_staleness`` (whose snapshots are not this run's lag: the pipeline restarts, as without the file). A
        damaged file is an error naming it."""
        return self.load_file(os.path.join(folder, BEHAVIOUR_WEIGHTS_FILE)) is not None

    def load_file(self, path: str | os.PathLike) -> dict[str, Any] | None:
        """:meth:`load` from the file ``path``: the whole state read (its batches too), or ``None`` when nothing was
        taken (absent, or another ``max_staleness``'s, with a warning)."""
        if not os.path.exists(path):
            return None
        state = read_checkpoint_file(path)
        try:
            taken = self.load_state_dict(state)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise RuntimeError(
                f"{path} cannot be read ({type(error).__name__}: {error}). Resume from an earlier checkpoint, or delete "
                "the file to restart the pipeline from the checkpoint's weights (the next batches are then less stale "
                "than in the uninterrupted run)."
            ) from error
        if not taken:
            warnings.warn(
                f"{path} was saved with max_staleness={state['max_staleness']}, this run has "
                f"max_staleness={self.max_staleness}: its snapshots are not used and the pipeline restarts from "
                "the checkpoint's weights (the next batches are less stale than k until the run has made k more "
                "steps). Resume with the checkpoint's max_staleness to continue its lag exactly.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return None
        return state


def write_atomically(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save(state, path)`` through a temporary file and ``os.replace``: a kill leaves the old file or none."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    torch.save(state, temporary)
    os.replace(temporary, path)


def read_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """A file of :func:`write_atomically`; a damaged one is a ``RuntimeError`` naming it and the way out."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not the saved dict")
    except (RuntimeError, EOFError, KeyError, IndexError, TypeError, OSError) as error:
        raise RuntimeError(
            f"{path} cannot be read ({type(error).__name__}: {error}). Resume from an earlier checkpoint, or delete "
            "the file to restart the pipeline from the checkpoint's weights (the next batches are then less stale "
            "than in the uninterrupted run)."
        ) from error
    return state


#: The pipelines resumed from a checkpoint: the generation step each resumed at, and what its checkpoint lacks for the
#: next ``k`` batches (:func:`resume_shortfall`), for :func:`restart_pipeline` to say.
_RESUMED: weakref.WeakKeyDictionary[BehaviourWeights, tuple[int, str | None]] = weakref.WeakKeyDictionary()


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


def resume_shortfall(
    state: dict[str, Any], *, world_size: int, keep_all: bool, samples_ahead: bool, snapshot_reason: str | None
) -> str | None:
    """What a checkpoint's asynchronous ``state`` (:meth:`AsyncRollouts.save`) cannot give the run resuming from it
    for its next ``k`` batches, said as the difference between the two runs that makes it so: the number of processes
    (each kept its own sampled rows), a run that samples ahead resumed by one that keeps snapshots (``keep_all``: it
    needs the weights of ``k`` steps earlier at each step, ``snapshot_reason``), or a checkpoint written at the end of
    its run (nothing past it was sampled ahead). ``None``: it gives them all (or nothing recorded says why not).
    The restart warning names this one cause, where it listed every possible one."""
    if state.get("format") != ASYNC_STATE_FORMAT:
        return None  # the earlier format held the last k + 1 snapshots: the weights of every next batch
    k, resumed, first = int(state["max_staleness"]), int(state["generation_steps"]), int(state["first_step"])
    kept, batches = {int(step) for step in state["snapshot_steps"]}, {int(step) for step in state["batches"]}
    usable = batches if samples_ahead and state["world_size"] == world_size else set()
    lacking = [
        step
        for step in range(resumed, resumed + k)
        if max(step - k, first) not in kept and (keep_all or step not in usable)
    ]
    if not lacking:
        return None
    causes = []
    if samples_ahead and state["world_size"] != world_size and batches & set(lacking):
        written, now = _processes(state["world_size"]), _processes(world_size)
        causes.append(
            f"was written by {written} and this run has {now}: each of its processes kept its own rows of the batches "
            f"it had sampled ahead (generation steps {sorted(batches)}), which {now} cannot take over. Resume with "
            f"{written} to train on them as the checkpoint's run would have"
        )
    if keep_all:
        causes.append(
            f"kept the batches its run had sampled ahead, not the weights that sample generation steps {lacking}, "
            f"and this run samples each batch at its own step with the weights of k steps earlier ({snapshot_reason}). "
            "Resume with the checkpoint's async_generator and sampling settings to continue its lag exactly"
        )
    elif not batches & set(lacking):
        last = max(batches, default=resumed - 1)
        causes.append(
            f"was written at the end of its run (its max_steps): nothing past generation step {last} was sampled "
            f"ahead, nor the weights that sample generation steps {lacking} kept. A run continued past the "
            "checkpoint's max_steps restarts its pipeline once"
        )
    return "; and it ".join(causes) or None


def restart_pipeline(behaviour: BehaviourWeights, missing: LookupError) -> None:
    """The behaviour weights of a batch are not kept (``missing`` says which): the pipeline restarts from the current
    weights, with a warning that says why it happens: at the first steps after a resume, the difference between
    the checkpoint's run and this one (:func:`resume_shortfall`, noted by :meth:`AsyncRollouts.restore`)."""
    newest = behaviour.generation_steps - 1
    resumed_at, shortfall = _RESUMED.pop(behaviour, (None, None))
    if resumed_at is not None and resumed_at <= newest <= resumed_at + behaviour.max_staleness:
        why = (
            f"The checkpoint this run resumed from {shortfall}."
            if shortfall
            else "The checkpoint this run resumed from holds neither the next batches nor their weights."
        )
    else:
        why = (
            "It keeps the weights its batches need up to the first generation step after the last one train() "
            "trains; this one is later."
        )
    warnings.warn(
        f"Asynchronous rollouts: {missing}. The pipeline restarts from the current weights (the next batches are less "
        f"stale than max_staleness until it has run k more steps). {why}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    behaviour.restart(newest)


def importance_weight_share_changed(
    ratio: torch.Tensor, mask: torch.Tensor, mode: str, clip_min: float | None, clip_max: float | None
) -> float:
    """The share of completion tokens (or sequences, for the ``sequence_*`` modes) whose importance-sampling weight
    the correction changed: masked to 0 (``*_mask``, ``token_icepop``) or truncated at a bound (``*_truncate``)."""
    changed, counted = weight_share_changed(ratio, mask, mode, clip_min, clip_max)
    return changed / counted if counted else 0.0


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


def resolve_async_rollouts(requested: bool | None, problem: str | None, config_name: str) -> bool:
    """Whether a run samples asynchronously: ``async_rollouts=True`` where it cannot is an error; ``None`` (a preset's
    "where the run supports it") falls back to synchronous with a warning that says why."""
    if requested is False:
        return False
    if problem is None:
        return True
    if requested is True:
        raise ValueError(f"async_rollouts=True: {problem}. Set async_rollouts=False to train synchronously.")
    warnings.warn(
        f"async_rollouts=None ({config_name}'s default): this run trains synchronously, because {problem}. Set "
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
    - ``async_generator="inline"`` where TRL's own ``_generate`` samples (vLLM, tools or environments, a
      vision-language model, a ``rollout_func``, transformers' continuous batching, more or less than one generation
      per optimizer step); ``max_staleness=0`` keeps no snapshot anyway.
    """
    args = host.args
    if args.max_staleness == 0:
        return "max_staleness=0 (no snapshot is kept)"
    if host.rollout.generates_extra_rounds:
        return "dynamic sampling's extra rounds are sampled by the weights of k steps earlier after round 0's rewards"
    if host._uses_topk_divergence and not host.use_vllm:
        return "DPPO's top-K divergence is computed from the model with the behaviour weights"
    if args.async_generator != "inline":
        return None
    trl_samples = (
        (host.use_vllm, "use_vllm=True"),
        (getattr(args, "use_transformers_continuous_batching", False), "use_transformers_continuous_batching=True"),
        (bool(host.tools) or host.environment_factories is not None, "tools or environments"),
        (host._is_vlm, "a vision-language model"),
        (host.rollout_func is not None, "a rollout_func"),
        (
            args.steps_per_generation * host.num_iterations != args.gradient_accumulation_steps,
            "more or less than one generation per optimizer step",
        ),
    )
    found = [what for bad, what in trl_samples if bad]
    return f"TRL's own generation samples each batch at its step ({', '.join(found)})" if found else None


def check_ahead_generator(
    generator: str,
    *,
    uses_vllm: bool,
    vllm_mode: str | None,
    tools: bool,
    vision_language: bool,
    one_generation_per_step: bool,
    quantized: bool,
    rollout_func: bool = False,
    continuous_batching: bool = False,
) -> None:
    """``async_generator="process"`` or ``"server"`` refuses, naming each with its way out, what its generator cannot
    sample as TRL's ``_generate`` would: everything else TRL's generation reads (``generation_kwargs``, ``top_p``,
    ``top_k``, ``min_p``, ``repetition_penalty``, ``cache_implementation``, the chat template and its kwargs) reaches
    the worker through the trainer's ``generation_config`` and tokenized prompts, or the server through TRL's own
    sampling parameters."""
    custom_rollouts = (
        rollout_func,
        "a rollout_func (it samples the batches ahead itself and would never call it: async_generator='inline' calls "
        "it with the behaviour weights in the model, and a vLLM engine synced with them)",
    )
    one_per_step = (
        not one_generation_per_step,
        "more or less than one generation per optimizer step (steps_per_generation * num_iterations must equal "
        "gradient_accumulation_steps)",
    )
    if generator == "process":
        problems = (
            (uses_vllm, "use_vllm=True (vLLM is its own engine: use async_generator='server' or 'inline')"),
            (tools, "tools or environments"),
            (vision_language, "a vision-language model"),
            one_per_step,
            (quantized, "a bitsandbytes-quantized model"),
            custom_rollouts,
            (
                continuous_batching,
                "use_transformers_continuous_batching=True (or use_transformers_paged; the worker samples with HF "
                "generate: set it False, or use async_generator='inline')",
            ),
        )
    else:
        problems = (
            (
                not uses_vllm or vllm_mode != "server",
                f"use_vllm={uses_vllm}, vllm_mode={vllm_mode!r} (it sends requests to TRL's vLLM server: set "
                "use_vllm=True, vllm_mode='server')",
            ),
            (tools, "tools or environments"),
            (vision_language, "a vision-language model (its image features are not sent ahead)"),
            one_per_step,
            custom_rollouts,
        )
    found = [what for bad, what in problems if bad]
    if found:
        raise ValueError(f"async_generator={generator!r} does not support {'; '.join(found)}.")


def job_seed(base_seed: int, step: int, round_index: int, process_index: int) -> int:
    """The sampling seed of one generation call: the same for the in-process and the worker generator."""
    return (base_seed * 1_000_003 + step * 10_007 + round_index * 101 + process_index) % (2**31 - 1)


@contextlib.contextmanager
def seeded_sampling(seed: int) -> Iterator[None]:
    """Sample with ``seed`` without touching the process's global RNG streams (the trainer's dropout, shuffles): the
    CPU's and, since ``torch.manual_seed`` reseeds them too, every CUDA device's."""
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        torch.manual_seed(seed)
        yield


class ReadAhead:
    """The dataloader batches of the next ``depth`` optimizer steps, read before they are trained on, so that their
    generation can start early. Within an epoch only (the Trainer builds a new iterator per epoch): at the start of
    an epoch the pipeline refills, as at the start of training. Each optimizer step is one generation step here (the
    process generator requires ``steps_per_generation * num_iterations == gradient_accumulation_steps``), and the
    first batch of a step is its generation batch."""

    def __init__(self, depth: int):
        self.depth = depth
        self._iterator = None
        self._buffer: deque = deque()
        self.next_step: int | None = None  # the generation step of the next batches handed out

    def take(self, epoch_iterator, num_batches: int, first_step: int) -> list:
        if self.next_step is None:
            self.next_step = first_step
        if epoch_iterator is not self._iterator:
            self._iterator, self._buffer = epoch_iterator, deque()
        while len(self._buffer) < num_batches * (1 + self.depth):
            try:
                self._buffer.append(next(epoch_iterator))
            except StopIteration:
                break
        taken = [self._buffer.popleft() for _ in range(min(num_batches, len(self._buffer)))]
        self.num_batches = num_batches
        self.next_step += 1
        return taken

    def future(self) -> dict[int, list]:
        """``{generation step: its generation batch}`` for the steps read ahead."""
        if self.next_step is None or not self._buffer:
            return {}
        per_step = self.num_batches
        return {self.next_step + i // per_step: self._buffer[i] for i in range(0, len(self._buffer), per_step)}


class InProcessGenerator:
    """The generator of :class:`AheadPipeline` for ``async_generator="inline"`` without snapshots: it samples a job
    in the training process as soon as it is submitted (the batch of step ``g + k`` at step ``g``, with the weights
    the model holds then) and keeps the sampled batch until it is collected. A ``Generator`` (the same ``submit`` /
    ``result`` / ``close`` as :class:`~trl_reasoning.async_rollouts.process_generator.GeneratorProcess`); nothing
    overlaps.

    Args:
        sample: samples one job with the weights the model holds, returning ``(completion ids, sampled-token
            log-probs)``.
        transport: puts the job's weights in the model around ``sample`` (:class:`ModelSwap`).
    """

    alive = True
    last_ranked = None

    def __init__(
        self, sample: Callable[[GenerationJob], tuple[list[list[int]], list[list[float]]]], transport: ModelSwap
    ):
        self._sample = sample
        self.transport = transport
        self._done: dict[int, tuple[list[list[int]], list[list[float]], float]] = {}
        self.submitted: set[int] = set()

    def submit(self, job: GenerationJob) -> None:
        if job.step in self.submitted:
            return
        started = time.perf_counter()
        with self.transport.holding(job.weights):
            completions, logps = self._sample(job)
        self._done[job.step] = (completions, logps, time.perf_counter() - started)
        self.submitted.add(job.step)

    def release(self) -> None:
        """Nothing to wait for: every job was sampled at its submission."""

    def result(self, step: int) -> GeneratorResult:
        """``(completions, log-probs, seconds spent sampling them, 0.0)``: sampled at submission, nothing to wait for."""
        completions, logps, seconds = self._done.pop(step)
        self.submitted.discard(step)
        return completions, logps, seconds, 0.0

    def close(self) -> None:
        self._done.clear()
        self.submitted.clear()


class AheadPipeline(TrainerCallback):
    """Asynchronous rollouts with a generator that samples ahead of the trainer: in the training process
    (``async_generator="inline"``, :class:`InProcessGenerator`), a worker process (``"process"``,
    :class:`GeneratorProcess`) or TRL's vLLM server (``"server"``,
    :class:`~trl_reasoning.async_rollouts.server_generator.ServerGenerator`). The batches of the next ``k`` generation steps are
    read ahead (:class:`ReadAhead`) and submitted with their behaviour weights as soon as those exist (batch ``g + k``
    at step ``g``, with the model's weights then), so the generator samples them while the trainer trains; the
    trainer then collects each batch at its step. The batches submitted and not yet trained on are the pipeline's
    state: a checkpoint keeps them (:meth:`state_dict`), so a resumed run trains on the same batches. The generator is
    started at the first submission and stopped at the end of training (this object is also the callback that stops
    it).

    Without ``behaviour.keep_all`` no weights are kept but those of a batch that cannot be sampled yet: at step ``g``
    the weights of step ``g`` when batch ``g + k`` is not read ahead (it belongs to the next epoch, whose prompts
    are drawn when it starts), released once that batch is submitted."""

    def __init__(
        self,
        behaviour: BehaviourWeights,
        start_generator: Callable[[], Generator],
        tokenize: Callable[[list], list[list[int]]],
        seed_of: Callable[[int], int],
        current_weights: Callable[[], dict[str, torch.Tensor]],
    ):
        self.behaviour = behaviour
        self.read_ahead = ReadAhead(behaviour.max_staleness)
        self._start_generator = start_generator
        self._tokenize = tokenize
        self._seed_of = seed_of
        self._current_weights = current_weights
        self._generator: Generator | None = None
        self._jobs: dict[int, tuple[list, list[list[int]]]] = {}  # submitted, not yet collected: prompts, their ids
        self._ready: dict[int, tuple] = {}  # sampled and taken from the generator: completions, log-probs, s, top-K
        self._restored: dict[int, dict[str, Any]] = {}  # a checkpoint's batches, until their step submits them
        self.last_step: int | None = None  # the last generation step this train() trains (none is sampled past it)
        self.last_generation_seconds = self.last_wait_seconds = 0.0  # the generator's time on a batch; the wait for it
        self.last_ranked: tuple[list, list, list] | None = None  # a vLLM server's top-K of the last batch (DPPO)

    @property
    def generator(self) -> Generator:
        """The generator, started at first use (a worker that died is reported by the next wait, never replaced)."""
        if self._generator is None:
            self._generator = self._start_generator()
        return self._generator

    def _weights_now(self) -> dict[str, torch.Tensor]:
        """The model's trainable weights: those of the current generation step (the pipeline submits between a step's
        recording and its optimizer step)."""
        return self._current_weights()

    def submit(self, step: int, prompts: list) -> None:
        """Send the batch of generation ``step`` (its ``prompts``, this process's rows) to the generator, once (or
        take it from the checkpoint the run resumed from)."""
        if step in self._jobs:
            return
        restored = self._restored.pop(step, None)
        if restored is not None:
            if restored["prompts"] == prompts:
                self._jobs[step] = (prompts, restored["prompt_ids"])
                self._ready[step] = (restored["completion_ids"], restored["logprobs"], 0.0, restored["ranked"])
                return
            warnings.warn(
                f"The checkpoint's sampled batch of generation step {step} has other prompts than the run reads now "
                "(the dataset or its order changed): it is sampled again.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        generator = self.generator
        prompt_ids = self._tokenize(prompts)
        try:
            weights = self.behaviour.versioned_for(step, self._weights_now())
        except LookupError as missing:
            restart_pipeline(self.behaviour, missing)
            weights = self.behaviour.versioned_for(step, self._weights_now())
        self._jobs[step] = (prompts, prompt_ids)
        generator.submit(GenerationJob(step, prompt_ids, weights, self._seed_of(step)))

    def submit_ahead(self) -> None:
        """At a new generation step: submit every batch read ahead whose behaviour weights now exist; then keep the
        weights of this step if a batch that is not read ahead yet will need them, and release those no batch
        needs any more."""
        newest = self.behaviour.generation_steps - 1
        self._restored = {step: batch for step, batch in self._restored.items() if step >= newest}
        for step, rows in self.read_ahead.future().items():
            beyond_training = self.last_step is not None and step > self.last_step
            if step <= newest + self.behaviour.max_staleness and not beyond_training:
                self.submit(step, [row["prompt"] for row in rows])
        if self.behaviour.keep_all:
            return
        if self._needs_weights_of(newest) and newest not in self.behaviour.kept_steps:
            self.behaviour.keep(newest, self._weights_now())
        for step in self.behaviour.kept_steps:
            if not self._needs_weights_of(step):
                self.behaviour.release(step)

    def _needs_weights_of(self, source: int) -> bool:
        """Whether a batch not submitted yet is sampled by the weights of ``source``: up to the first step after the
        last one ``train()`` trains (a generation step after ``train()``, as a second ``train()`` makes, samples by the
        weights of ``k`` steps earlier too; the steps after it restart the pipeline)."""
        behaviour = self.behaviour
        newest = behaviour.generation_steps - 1
        last = source + behaviour.max_staleness if self.last_step is None else self.last_step + 1
        return any(
            behaviour.source_of(step) == source and step not in self._jobs and step not in self._restored
            for step in range(max(source, newest + 1), min(source + behaviour.max_staleness, last) + 1)
        )

    def collect(self, step: int, prompts: list) -> dict[str, list]:
        """The batch of generation ``step`` as TRL's ``rollout_func`` returns one (waiting for the generator)."""
        self.submit(step, prompts)
        job_prompts, prompt_ids = self._jobs.pop(step)
        if job_prompts != prompts:
            raise GeneratorError(
                f"The batch the generator sampled for generation step {step} was read ahead with other prompts "
                "than the step trains on: the read-ahead lost its place in the dataloader. Please report this; "
                "async_generator='inline' avoids it."
            )
        if step in self._ready:
            completions, logps, self.last_generation_seconds, self.last_ranked = self._ready.pop(step)
            self.last_wait_seconds = 0.0
        else:
            completions, logps, self.last_generation_seconds, self.last_wait_seconds = self.generator.result(step)
            self.last_ranked = self.generator.last_ranked
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": logps}

    def release_engine(self) -> None:
        """Before the trainer's own generation (an evaluation, an extra dynamic-sampling round): a vLLM server first
        answers what it was sent ahead, and gets the next batch's weights pushed again afterwards."""
        if self._generator is not None:
            self._generator.release()

    # ----------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[int, dict[str, Any]]:
        """The batches submitted and not yet trained on, sampled (this waits for those still in the generator; on
        every process, in the same order: a vLLM server's answers are broadcast), with their prompts."""
        for step in sorted(self._jobs):
            if step not in self._ready:
                completions, logps, seconds, _ = self.generator.result(step)
                self._ready[step] = (completions, logps, seconds, self.generator.last_ranked)
        batches = {
            step: {
                "prompts": self._jobs[step][0],
                "prompt_ids": self._jobs[step][1],
                "completion_ids": self._ready[step][0],
                "logprobs": self._ready[step][1],
                "ranked": self._ready[step][3],
            }
            for step in sorted(self._jobs)
        }
        return {**self._restored, **batches}

    def load_state_dict(self, batches: dict[int, dict[str, Any]]) -> None:
        """Take a checkpoint's batches: each is trained on at its step, instead of being sampled again."""
        self._restored = {int(step): batch for step, batch in batches.items()}

    def close(self, keep_restored: bool = False) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        self._jobs.clear()
        self._ready.clear()
        if not keep_restored:
            self._restored.clear()
        self.read_ahead = ReadAhead(self.behaviour.max_staleness)  # a later train() reads from its own position

    def on_train_begin(self, args, state, control, **kwargs):
        # a train() that raised (a timeout, Ctrl-C) left its generator and read-ahead behind; a resumed one has just
        # restored the checkpoint's batches
        self.close(keep_restored=True)
        # One generation per optimizer step (the ahead generators require it): generation step g is trained at
        # optimizer step g, so the batches read ahead past max_steps would be sampled for nothing.
        self.last_step = state.max_steps - 1

    def on_train_end(self, args, state, control, **kwargs):
        self.close()


def async_rollouts_for(host: AsyncRolloutHost, sampler_problem: str | None = None) -> AsyncRollouts | None:
    """The asynchronous side of ``host``'s rollouts, or ``None`` when it trains synchronously (``async_rollouts``:
    ``True`` is an error where the run cannot, ``None`` is on where it can and a warning where it cannot).
    ``sampler_problem``: why the sampler's log-probabilities cannot be compared with the policy's (its settings)."""
    zero_stage = getattr(getattr(host.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
    problem = (
        async_rollouts_problem(
            sharded=host.is_fsdp_enabled or (host.is_deepspeed_enabled and zero_stage == 3),
            vision_language=host._is_vlm,
            uses_vllm=host.use_vllm,
        )
        or sampler_problem
    )
    on = resolve_async_rollouts(host.args.async_rollouts, problem, type(host.args).__name__)
    return AsyncRollouts(host) if on else None


class AsyncRollouts:
    """Where an asynchronous batch comes from (``async_rollouts=True``): the behaviour policy's weights
    (:class:`BehaviourWeights`, saved in checkpoints), the pipeline that samples ahead (``async_generator="process"``
    or ``"server"``), and TRL's own generation of a training batch with the behaviour weights swapped in.

    The trainer (``host``, the seam) calls :meth:`begin_generation_step` at each generation step, :meth:`generate` in
    place of TRL's ``_generate``, :meth:`scoring` around TRL's scoring of a batch, and lends it what
    :class:`~trl_reasoning.async_rollouts.protocols.AsyncRolloutHost` names (TRL's ``_generate`` as ``trl_generate``,
    ``behaviour_logps``, ``tokenize_prompts``, and the Trainer's and TRL's state), with
    :class:`~trl_reasoning.async_rollouts.protocols.VLLMBackendHost` or
    :class:`~trl_reasoning.async_rollouts.protocols.GenerateBackendHost` by backend.
    """

    def __init__(self, host: AsyncRolloutHost):
        self.host = host
        #: Why this run keeps ``k + 1`` snapshots of the trainable weights (``None``: it keeps the sampled batches).
        self.snapshot_reason = snapshots_needed_by(host)
        self.behaviour = BehaviourWeights(host.args.max_staleness, keep_all=self.snapshot_reason is not None)
        self.generates_with_vllm = host.use_vllm  # use_vllm reads True while TRL scores a batch (see scoring)
        self.generation_round = 0  # generation calls so far in this generation step (dynamic sampling: several)
        # the training process's weight transport: the in-process generator's, and what TRL's sync sends to a server
        self.model_swap = ModelSwap(
            lambda: trainable_parameters(host.model),
            lambda: self.behaviour.generation_steps - 1 if self.behaviour.generation_steps else None,
        )
        samples_ahead = host.args.async_generator != "inline" or self.snapshot_reason is None
        self.pipeline = self._ahead_pipeline() if samples_ahead else None
        if self.pipeline is not None:
            host.add_callback(self.pipeline)

    def _ahead_pipeline(self) -> AheadPipeline:
        """``async_generator="process"`` or ``"server"``: the pipeline that samples ahead, after checking the run fits
        its generator."""
        host, args = self.host, self.host.args
        if args.async_generator == "inline":  # snapshots_needed_by found nothing it cannot sample ahead
            return AheadPipeline(
                self.behaviour,
                start_generator=lambda: InProcessGenerator(self._sample_in_process, self.model_swap),
                tokenize=host.tokenize_prompts,
                seed_of=lambda step: job_seed(args.seed, step, 0, host.accelerator.process_index),
                current_weights=lambda: trainable_parameters(host.model),
            )
        check_ahead_generator(
            args.async_generator,
            uses_vllm=host.use_vllm,
            vllm_mode=getattr(host, "vllm_mode", None) if host.use_vllm else None,
            tools=bool(host.tools) or host.environment_factories is not None,
            vision_language=host._is_vlm,
            one_generation_per_step=args.steps_per_generation * host.num_iterations
            == args.gradient_accumulation_steps,
            quantized=getattr(host.model, "is_loaded_in_4bit", False)
            or getattr(host.model, "is_loaded_in_8bit", False),
            rollout_func=host.rollout_func is not None,
            continuous_batching=bool(getattr(args, "use_transformers_continuous_batching", False)),
        )
        if args.async_generator == "server":

            def start_generator() -> ServerGenerator:
                return ServerGenerator(
                    vllm_generation=host.vllm_generation,
                    accelerator=host.accelerator,
                    push_weights=self._push_behaviour_weights,
                    num_generations=host.num_generations,
                    timeout=args.async_timeout,
                )

        else:
            settings = self._settings()

            def start_generator() -> GeneratorProcess:
                return GeneratorProcess(
                    host.model, settings, args.async_timeout, log_path=generator_log(args.output_dir)
                )

            def generator_log(output_dir: str | None) -> str | None:
                """The worker's own output (warnings, a crash below Python) goes to a file of the output dir, one
                per process of the run; its Python errors reach the trainer as errors."""
                if not output_dir:
                    return None
                with contextlib.suppress(OSError):
                    os.makedirs(output_dir, exist_ok=True)
                return os.path.join(output_dir, f"generator_process_rank{host.accelerator.process_index}.log")

        return AheadPipeline(
            self.behaviour,
            start_generator=start_generator,
            tokenize=host.tokenize_prompts,
            seed_of=lambda step: job_seed(args.seed, step, 0, host.accelerator.process_index),
            current_weights=lambda: trainable_parameters(host.model),
        )

    def _push_behaviour_weights(self, weights: VersionedWeights) -> None:
        """``async_generator="server"`` (called by its transport when the version changes): TRL's weight sync with
        ``weights`` in the model (:class:`ModelSwap`: the model's own weights are pushed as they are); TRL's own paths
        sync the current weights again before they next sample (evaluation)."""
        with self.model_swap.holding(weights):
            self.host.vllm_generation.sync_weights()
        self.host._last_loaded_step = -1

    def _sample_in_process(self, job: GenerationJob) -> tuple[list[list[int]], list[list[float]]]:
        """``async_generator="inline"`` sampling ahead: ``generate`` as TRL's ``_generate_single_turn`` calls it (the
        worker process's :func:`~trl_reasoning.async_rollouts.process_generator.sample`) on the trainer's own model
        (which holds the job's weights: :class:`InProcessGenerator` swaps them in), with the job's seed, and the
        sampled tokens' log-probabilities under those weights."""
        from trl.models import unwrap_model_for_generation

        host = self.host
        settings = self._settings()
        with seeded_sampling(job.seed):
            with unwrap_model_for_generation(
                host.model_wrapped,
                host.accelerator,
                gather_deepspeed3_params=host.args.ds3_gather_for_generation,
                generation_kwargs=host.generation_kwargs,
                gradient_checkpointing_kwargs=host.args.gradient_checkpointing_kwargs,
            ) as unwrapped:
                # mu's log-probs from generate's own scores, as the worker process reads them
                completions, logps = sample(unwrapped, job.prompt_ids, settings)
        return completions, logps

    def _settings(self) -> SamplingSettings:
        """How the trainer samples, for a generator outside TRL's ``_generate``."""
        host = self.host
        return SamplingSettings(
            generation_config=host.generation_config,
            pad_token_id=host._tokenizer.pad_token_id,
            eos_token_ids=list(host.eos_token_ids),
            temperature=host.temperature,
            pad_to_multiple_of=host.pad_to_multiple_of,
            batch_size=host.args.per_device_train_batch_size,
            device=str(host.accelerator.device),
        )

    # --------------------------------------------------------------------------------------- at a generation step
    def start_fresh(self) -> None:
        """A ``train()`` that does not resume starts as a fresh run of this trainer (TRL's semantics of a second
        ``train()``: the trainer state starts over, the weights are the model's now): generation step 0, sampled by the
        current weights, the lag growing to ``k`` again. Without this, a second ``train()`` carried the first one's
        generation-step counter into a run whose step counter starts at 0, and restarted the pipeline every step."""
        if self.pipeline is not None:
            self.pipeline.close()
        self.behaviour.reset()
        self.generation_round = 0

    def begin_generation_step(self, inputs: list[dict]) -> None:
        """Record the weights of this generation step (a later batch's behaviour policy) and send the batches whose
        behaviour weights now exist to the generator that samples ahead: this step's own batch (``inputs``) first,
        where it was not sent ahead (the first step of a run or of an epoch), so that it does not wait behind the
        next ``k`` in the generator's queue."""
        self.behaviour.record(trainable_parameters(self.host.model))
        self.generation_round = 0
        if self.pipeline is None and self.behaviour.staleness > 0:
            try:
                self.behaviour.weights_for(self.behaviour.generation_steps - 1)
            except LookupError as missing:
                restart_pipeline(self.behaviour, missing)
        if self.pipeline is not None:
            self.pipeline.submit(self.behaviour.generation_steps - 1, [row["prompt"] for row in inputs])
            self.pipeline.submit_ahead()

    def batch_samples(self, epoch_iterator, num_batches: int) -> list:
        """With a generator that samples ahead: the dataloader batches of this optimizer step, those of the next
        ``max_staleness`` steps read ahead."""
        return self.pipeline.read_ahead.take(epoch_iterator, num_batches, self.behaviour.generation_steps)

    @contextlib.contextmanager
    def scoring(self) -> Iterator[None]:
        """Around TRL's scoring of a training batch. TRL computes its importance-sampling correction between ``pi_old``
        and the sampler's log-probs only when ``use_vllm``: an asynchronous batch takes that same path (TRL's code,
        modes and metrics), so ``use_vllm`` reads True while TRL scores it (:meth:`generate` restores the real backend
        for generation). Whether TRL builds the correction itself, or the loss does from its own forward, is the
        trainer's choice (``ReasoningTrainer._importance_sampling_source``)."""
        host = self.host
        if not host.model.training:
            yield
            return
        saved = host.use_vllm
        host.use_vllm = True
        try:
            yield
        finally:
            host.use_vllm = saved

    # ------------------------------------------------------------------------------------------------ generation
    def generate(self, prompts):
        """TRL's ``_generate`` for a training batch, with the behaviour weights swapped into the model (vLLM is synced
        with them first) or collected from the generator that sampled ahead, and the sampled tokens' log-probabilities
        under them recorded: vLLM returns them; with ``generate`` they are read from the scores it sampled from (the
        truncated, renormalised distribution when sampling truncates), without another forward.
        Evaluation samples with the current weights, as TRL does."""
        host = self.host
        if not host.model.training:
            if self.pipeline is not None:
                self.pipeline.release_engine()  # a vLLM server answers what it was sent ahead before it syncs anew
            return host.trl_generate(prompts)
        step, round_index = self.behaviour.generation_steps - 1, self.generation_round
        self.generation_round += 1
        staleness = self.behaviour.staleness
        scoring_backend = host.use_vllm
        host.use_vllm = self.generates_with_vllm
        try:
            if self.pipeline is not None and round_index == 0:
                generated = self._collected(step, prompts)
            else:
                if self.pipeline is not None:
                    self.pipeline.release_engine()
                seed = job_seed(host.args.seed, step, round_index, host.accelerator.process_index)
                with (
                    self.behaviour.swapped_in(trainable_parameters(host.model)),
                    self._sampling_seed(seed),
                    self._scores_recorded() as records,
                ):
                    if host.use_vllm:
                        host._last_loaded_step = -1  # sync the engine with the behaviour weights
                    generated = host.trl_generate(prompts)
                    if generated[4] is None:
                        logps = completion_logps(records, generated[1])
                        if logps is None:  # not one plain generate call (tools): score the batch by a forward
                            logps = self._sampled_token_logps(generated[0], generated[1])
                        generated = (*generated[:4], logps, *generated[5:])
        finally:
            host.use_vllm = scoring_backend
            if self.generates_with_vllm:
                host._last_loaded_step = -1  # the engine holds the behaviour weights: sync before it samples again
        host._metrics["train"]["async/staleness"].append(float(staleness))
        return generated

    def _collected(self, step: int, prompts):
        """The batch the generator sampled ahead, through TRL's own ``rollout_func`` path of ``_generate`` (decoding,
        completion metrics)."""
        host = self.host
        rollout = self.pipeline.collect(step, prompts)
        own_rollout_func, backend = host.rollout_func, host.use_vllm
        host.rollout_func = lambda _prompts, _trainer: rollout
        host.use_vllm = False  # TRL would sync the current weights to a vLLM server that samples ahead with others
        try:
            generated = host.trl_generate(prompts)
        finally:
            host.rollout_func, host.use_vllm = own_rollout_func, backend
        if host._engine_topk is not None and self.pipeline.last_ranked is not None:
            host._engine_topk.append(self.pipeline.last_ranked)  # DPPO top-K: the server's own
        # how much of the generator's time the trainer still waited for (0: fully overlapped)
        host._metrics["train"]["async/generation_seconds"].append(self.pipeline.last_generation_seconds)
        host._metrics["train"]["async/wait_seconds"].append(self.pipeline.last_wait_seconds)
        return generated

    def _sampling_seed(self, seed: int):
        """With a lag, every generation call samples with its own seed (so the worker and the in-process generator
        draw the same batch); ``max_staleness=0`` keeps the global RNG stream, exactly as a synchronous run."""
        return seeded_sampling(seed) if self.behaviour.max_staleness > 0 else contextlib.nullcontext()

    def _scores_recorded(self):
        """Around TRL's generation with HF ``generate``: the sampled tokens' log-probs read from the scores it
        sampled from (``trl_reasoning.async_rollouts.sampler_logps``), which spares a forward; vLLM returns its own."""
        if self.host.use_vllm:
            return contextlib.nullcontext([])
        return sampled_logps_recorded(self.host.model)

    def _sampled_token_logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """The sampled tokens' log-probabilities under the model as it is now, by a no-grad forward over the batch laid
        out as TRL lays it out: only where ``generate``'s scores were not recorded (TRL's tool-calling loop, several
        ``generate`` calls a batch)."""
        host = self.host
        batch = padded_batch(prompt_ids, completion_ids, host._tokenizer.pad_token_id, host.pad_to_multiple_of)
        logps = host.behaviour_logps({key: value.to(host.accelerator.device) for key, value in batch.items()})
        return [row[: len(ids)].tolist() for row, ids in zip(logps, completion_ids, strict=True)]

    def behaviour_weights_in(self, mode: str, engine_topk: bool):
        """Around a no-grad forward that must see the sampler's weights (DPPO's top-K from the model): the behaviour
        weights on a training batch, unless the top-K is the engine's own (vLLM's already comes from them)."""
        if mode != "train" or engine_topk:
            return contextlib.nullcontext()
        return self.behaviour.swapped_in(trainable_parameters(self.host.model))

    # ----------------------------------------------------------------------------------------------- checkpoints
    def save(self, folder: str | os.PathLike, write_shared: bool = True) -> None:
        """Called on every process. The batches its pipeline submitted and has not trained on yet, sampled (waiting
        for those still in its generator), go into the checkpoint: the main process's with the kept snapshots in
        ``BEHAVIOUR_WEIGHTS_FILE`` (when ``write_shared``), each other process's in its own
        :func:`rank_batches_file`."""
        batches = self.pipeline.state_dict() if self.pipeline is not None else {}
        accelerator = self.host.accelerator
        extra = {"format": ASYNC_STATE_FORMAT, "world_size": accelerator.num_processes, "batches": batches}
        if accelerator.process_index == 0:
            if write_shared:
                self.behaviour.save(folder, extra)
        elif self.pipeline is not None:
            write_atomically(os.path.join(folder, rank_batches_file(accelerator.process_index)), extra)

    def restore(self, checkpoint: str | os.PathLike) -> None:
        """The pipeline's state from ``checkpoint``: the kept snapshots and this process's sampled batches (or, from a
        checkpoint of the earlier format, the last ``k + 1`` snapshots, which sample the next batches). Without them or
        with another ``max_staleness``'s the pipeline restarts from the checkpoint's weights, with a warning; so it
        does, at the first step that needs them, where the checkpoint holds neither a batch nor its weights, with a
        warning that names why (:func:`resume_shortfall`: another number of processes, generator or sampling setting,
        or a checkpoint at the end of its run)."""
        path = os.path.join(checkpoint, BEHAVIOUR_WEIGHTS_FILE)
        if not os.path.exists(path):
            warnings.warn(
                f"{checkpoint} holds no behaviour weights of asynchronous rollouts: the pipeline restarts from the "
                "checkpoint's weights (the next batches are less stale than in an uninterrupted run).",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return
        state = self.behaviour.load_file(path)  # warns itself when it cannot use it
        if state is None:
            return
        _RESUMED[self.behaviour] = (
            int(state["generation_steps"]),
            resume_shortfall(
                state,
                world_size=self.host.accelerator.num_processes,
                keep_all=self.behaviour.keep_all,
                samples_ahead=self.pipeline is not None,
                snapshot_reason=self.snapshot_reason,
            ),
        )
        if self.pipeline is not None:
            self.pipeline.load_state_dict(self._restored_batches(checkpoint, state))

    def _restored_batches(self, checkpoint: str | os.PathLike, state: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """This process's batches in a checkpoint's state (none in the earlier format, or saved by another number of
        processes: each process kept its own rows)."""
        accelerator = self.host.accelerator
        if self.pipeline is None or state.get("format") != ASYNC_STATE_FORMAT:
            return {}
        if state["world_size"] != accelerator.num_processes or not state["batches"]:
            return {}
        if accelerator.process_index == 0:
            return state["batches"]
        path = os.path.join(checkpoint, rank_batches_file(accelerator.process_index))
        if not os.path.exists(path):
            raise RuntimeError(
                f"{path} is missing: the checkpoint's other processes kept their sampled batches, this one's are "
                "lost. Copy the whole checkpoint folder, resume from an earlier checkpoint, or delete "
                f"{BEHAVIOUR_WEIGHTS_FILE} to restart the pipeline from the checkpoint's weights."
            )
        return read_checkpoint_file(path)["batches"]
