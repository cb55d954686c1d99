"""The behaviour policy's weights of asynchronous rollouts, and their checkpoint files.

With ``async_rollouts=True`` and ``max_staleness=k`` the batch of generation step ``g`` is sampled from the weights
the policy had at generation step ``g - k`` (:class:`BehaviourWeights`: which step's weights sample which batch, and
the snapshots a later sampling still needs). :class:`ModelSwap` is the training process's ``WeightTransport``: it
swaps a job's weights into the trainer's own model and back. The asynchronous state goes into a checkpoint through
:func:`write_atomically` and comes back through :func:`read_checkpoint_file`; a resumed run that lacks what its next
``k`` batches need restarts the pipeline (:func:`restart_pipeline`) with a warning naming why
(:func:`resume_shortfall`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..utils.user_warnings import user_stacklevel
from .protocols import VersionedWeights

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


def host_snapshot(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``params`` in CPU memory, by name.

    A tensor on a CUDA device is copied into page-locked (pinned) memory, every copy queued and then waited for once.
    On an H200 with a 0.5B model in bf16 (``bench/gpu.py``), a fresh pageable copy of each tensor, each waited for,
    cost about 1.5 s at every step and made ScaleRL's asynchronous rollouts 6.4x slower than TRL's synchronous step.
    Pinned memory costs as much to allocate, but only for the first ``k + 1`` snapshots: PyTorch's pinned-memory cache
    hands a dropped snapshot's memory to the next one, and from then on the copy runs at the bus's speed. Other tensors
    (on a CPU, or sharded ones) are copied as before.
    """
    snapshot: dict[str, torch.Tensor] = {}
    devices: set[torch.device] = set()
    for name, tensor in params.items():
        tensor = tensor.detach()
        if tensor.is_cuda and type(tensor) is torch.Tensor:
            copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            copy.copy_(tensor, non_blocking=True)
            devices.add(tensor.device)
        else:
            copy = tensor.to("cpu", copy=True)
        snapshot[name] = copy
    for device in devices:
        # The snapshot is read on the CPU too (a checkpoint, a worker process): the queued copies must have landed.
        torch.cuda.current_stream(device).synchronize()
    return snapshot


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
            # Queued, not waited for: from a pinned snapshot (host_snapshot) each copy runs in order on the stream
            # that reads the weights next, so nothing is gained by a wait per tensor.
            param.copy_(weights[name], non_blocking=True)
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
        self._snapshots[step] = host_snapshot(params)

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
