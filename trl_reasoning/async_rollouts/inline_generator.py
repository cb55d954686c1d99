"""The in-process generator of asynchronous rollouts (``async_generator="inline"``, the default): the batches are
sampled in the training process, by the trainer's own model with the behaviour weights swapped in.

Where nothing needs a batch of step ``g`` sampled only at step ``g``, :class:`InProcessGenerator` samples each batch
as soon as its behaviour weights exist (the batch of step ``g + k`` at step ``g``) and keeps it until its step: the
same batches as the worker process gives (each call carries its own seed), without an overlap in time. Where TRL's own
``_generate`` samples (the runs its declaration lists: ``trl_reasoning.async_generators``, ``trl_samples_where``) or
a snapshot is kept anyway, the run samples each batch at its step through TRL's generation with the weights of ``k``
steps earlier swapped in: the pipeline keeps the last ``k + 1`` snapshots instead of batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .ahead import seeded_sampling
from .behaviour import ModelSwap
from .hf_sampling import sample, sampling_settings
from .protocols import AsyncRolloutHost, GenerationJob, GeneratorResult, WeightTransport
from .starts import register_generator


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


def sample_in_process(host: AsyncRolloutHost, job: GenerationJob) -> tuple[list[list[int]], list[list[float]]]:
    """``async_generator="inline"`` sampling ahead: ``generate`` as TRL's ``_generate_single_turn`` calls it (the
    worker process's :func:`~trl_reasoning.async_rollouts.hf_sampling.sample`) on the trainer's own model
    (which holds the job's weights: :class:`InProcessGenerator` swaps them in), with the job's seed, and the
    sampled tokens' log-probabilities under those weights."""
    from trl.models import unwrap_model_for_generation

    settings = sampling_settings(host)
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


@register_generator("inline")
def start_inline_generator(host: AsyncRolloutHost, model_swap: WeightTransport) -> Callable[[], InProcessGenerator]:
    """The training process samples ahead with :class:`InProcessGenerator` (where the run keeps no snapshots; else the
    pipeline leaves each batch to TRL's own generation at its step, with the behaviour weights swapped in)."""
    return lambda: InProcessGenerator(lambda job: sample_in_process(host, job), model_swap)
