"""The read-ahead of asynchronous rollouts: the pipeline that samples each batch as soon as its behaviour weights
exist, with a generator that runs ahead of the trainer.

Memory is O(k sampled batches), not O(k copies of the weights): :class:`AheadPipeline` samples each batch as soon as
its behaviour weights exist (the batch of step ``g + k`` at step ``g``, read ahead from the dataloader by
:class:`ReadAhead`, with the weights the model holds then: in the training process, a worker process or a vLLM
server) and keeps the sampled batches, in RAM and in checkpoints, until their step trains on them. Every generation
call samples with its own seed (:func:`job_seed`, :func:`seeded_sampling`), so the generators give the same batches
whatever the timing.

Seams (``trl_reasoning.async_rollouts.protocols``): :class:`AheadPipeline` holds its generator as a ``Generator``
(``InProcessGenerator``, ``GeneratorProcess``, ``ServerGenerator``, started by the function registered under
``async_generator``: ``trl_reasoning.async_rollouts.starts``) and submits each batch with ``VersionedWeights``
whose version is the generation step the weights are from (``BehaviourWeights.versioned_for``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import TrainerCallback

from ..utils.user_warnings import user_stacklevel
from .behaviour import BehaviourWeights, restart_pipeline
from .protocols import GenerationJob, Generator, GeneratorError


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


#: Job keys of later turns (:meth:`AheadPipeline.sample_turn`): past any generation step a run reaches.
TURN_KEYS = 10**12
#: A later turn's seed is its batch's plus this times the turn, so that each turn draws its own numbers.
TURN_SEED_STRIDE = 1_000_003


class AheadPipeline(TrainerCallback):
    """Asynchronous rollouts with a generator that samples ahead of the trainer: in the training process
    (``async_generator="inline"``, :class:`~trl_reasoning.async_rollouts.inline_generator.InProcessGenerator`), a
    worker process (``"process"``, :class:`~trl_reasoning.async_rollouts.process_generator.GeneratorProcess`) or TRL's
    vLLM server (``"server"``, :class:`~trl_reasoning.async_rollouts.server_generator.ServerGenerator`). The batches
    of the next ``k`` generation steps are read ahead (:class:`ReadAhead`) and submitted with their behaviour weights
    as soon as those exist (batch ``g + k`` at step ``g``, with the model's weights then), so the generator samples
    them while the trainer trains; the trainer then collects each batch at its step. The batches submitted and not yet
    trained on are the pipeline's state: a checkpoint keeps them (:meth:`state_dict`), so a resumed run trains on the
    same batches. The generator is started at the first submission and stopped at the end of training (this object is
    also the callback that stops it).

    Without ``behaviour.keep_all`` no weights are kept but those of a batch that cannot be sampled yet: at step ``g``
    the weights of step ``g`` when batch ``g + k`` is not read ahead (it belongs to the next epoch, whose prompts
    are drawn when it starts), released once that batch is submitted."""

    def __init__(
        self,
        behaviour: BehaviourWeights,
        start_generator: Callable[[], Generator],
        prepare: Callable[[int, list[dict]], tuple[list, list[list[int]]]],
        seed_of: Callable[[int], int],
        current_weights: Callable[[], dict[str, torch.Tensor]],
        forget_prepared: Callable[[], None] = lambda: None,
    ):
        self.behaviour = behaviour
        self.read_ahead = ReadAhead(behaviour.max_staleness)
        self._start_generator = start_generator
        self._prepare = prepare
        self._forget_prepared = forget_prepared  # what ``prepare`` started for batches that will not be trained
        self._seed_of = seed_of
        self._current_weights = current_weights
        self._generator: Generator | None = None
        self._jobs: dict[int, tuple[list, list[list[int]]]] = {}  # submitted, not yet collected: prompts, their ids
        self._ready: dict[int, tuple] = {}  # sampled and taken from the generator: completions, log-probs, s, top-K
        self._restored: dict[int, dict[str, Any]] = {}  # a checkpoint's batches, until their step submits them
        self.last_step: int | None = None  # the last generation step this train() trains (none is sampled past it)
        self.last_generation_seconds = self.last_wait_seconds = 0.0  # the generator's time on a batch; the wait for it
        self.last_ranked: tuple[list, list, list] | None = None  # a vLLM server's top-K of the last batch (DPPO)
        self._turn_jobs = 0  # later turns sent so far (their job keys follow TURN_KEYS)

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

    def submit(self, step: int, rows: list[dict]) -> None:
        """Send the batch of generation ``step`` (this process's dataset ``rows``) to the generator, once (or take it
        from the checkpoint the run resumed from). ``prepare`` gives its prompts as TRL's ``_generate`` will receive
        them, and their ids: with environments, each row's episode starts here
        (:class:`~trl_reasoning.async_rollouts.episodes.AheadEpisodes`)."""
        if step in self._jobs:
            return
        prompts, prompt_ids = self._prepare(step, rows)
        restored = self._restored.pop(step, None)
        if restored is not None:
            if restored["prompts"] == prompts:
                self._jobs[step] = (prompts, restored["prompt_ids"])
                self._ready[step] = (restored["completion_ids"], restored["logprobs"], 0.0, restored["ranked"])
                return
            warnings.warn(
                f"The checkpoint's sampled batch of generation step {step} has other prompts than the run reads now "
                "(the dataset or its order changed, or an environment's reset() answered otherwise): it is sampled "
                "again.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        generator = self.generator
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
                self.submit(step, rows)
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
        """The batch of generation ``step`` as TRL's ``rollout_func`` returns one (waiting for the generator); it was
        submitted at the start of its generation step at the latest."""
        if step not in self._jobs:
            raise GeneratorError(f"The batch of generation step {step} was never sent to the generator.")
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

    def sample_turn(self, step: int, prompt_ids: list[list[int]], turn: int) -> tuple[list, list]:
        """A later turn of the batch of generation ``step`` (TRL's tool loop continues each rollout from its prompt,
        completion and tool response, ``prompt_ids``): sampled by the generator with the batch's own behaviour
        weights, so that every turn of a sample comes from one policy version. Waits for it."""
        weights = self.behaviour.versioned_for(step, self._weights_now())
        key = TURN_KEYS + self._turn_jobs
        self._turn_jobs += 1
        seed = self._seed_of(step) + TURN_SEED_STRIDE * turn
        self.generator.submit(GenerationJob(key, prompt_ids, weights, seed, later_turn=True))
        completions, logps, seconds, waited = self.generator.result(key)
        self.last_generation_seconds += seconds
        self.last_wait_seconds += waited
        return completions, logps

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
        self._forget_prepared()
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
