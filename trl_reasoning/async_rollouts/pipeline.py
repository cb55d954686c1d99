"""Rollouts with a deterministic staleness bound (PipelineRL-k, ScaleRL §3.1): :class:`AsyncRollouts`, the trainer's
one entry to them, and :func:`async_rollouts_for`.

With ``async_rollouts=True`` and ``max_staleness=k`` the batch of generation step ``g`` is sampled from the weights
the policy had at generation step ``g - k`` (the first ``k`` batches from the initial weights), whatever the timing:
the staleness of every batch is ``min(g, k)`` generation steps. That is what a pipeline with ``k`` batches in flight
trains on, written so that a run is reproducible and resumes exactly. Three policies then meet in the loss:

- ``mu``, the behaviour policy that sampled (the weights of step ``g - k``); its log-probabilities are recorded at
  generation time (TRL's ``sampling_per_token_logps``), from the generator's own weights;
- ``pi_old``, the trainer's weights when the batch is trained (TRL's ``old_per_token_logps``);
- ``pi_theta``, the weights being optimised.

The parts, one module each: the behaviour weights and their checkpoint files (``behaviour``: ``BehaviourWeights``,
``ModelSwap``, ``write_atomically``, ``resume_shortfall``, ``restart_pipeline``), the run's checks (``checks``:
whether it can be asynchronous, whether it keeps snapshots or sampled batches, what its generator cannot sample
ahead), the read-ahead pipeline (``ahead``: ``ReadAhead``, ``AheadPipeline``, ``job_seed``), and the generators,
declared in ``trl_reasoning.async_generators`` and started by the functions registered in ``starts``
(``inline_generator``, ``process_generator``, ``server_generator``), with HF ``generate`` sampling in
``hf_sampling``. Each name is imported from the module that defines it.

Seams (``trl_reasoning.async_rollouts.protocols``): :class:`AsyncRollouts` reads and writes its trainer only through
the members ``AsyncRolloutHost`` names (with ``VLLMBackendHost`` or ``GenerateBackendHost``); ``AheadPipeline``
holds its generator as a ``Generator`` (``InProcessGenerator``, ``GeneratorProcess``, ``ServerGenerator``) and
submits each batch with ``VersionedWeights`` whose version is the generation step the weights are from
(``BehaviourWeights.versioned_for``); each generator's ``WeightTransport`` ships weights only when that version
changes (``ModelSwap`` in the training process).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..algorithms.importance_sampling import weight_share_changed
from ..async_generators import GENERATORS
from ..utils.user_warnings import user_stacklevel
from .ahead import AheadPipeline, job_seed, seeded_sampling
from .behaviour import (
    _RESUMED,
    ASYNC_STATE_FORMAT,
    BEHAVIOUR_WEIGHTS_FILE,
    BehaviourWeights,
    ModelSwap,
    rank_batches_file,
    read_checkpoint_file,
    restart_pipeline,
    resume_shortfall,
    trainable_parameters,
    write_atomically,
)
from .checks import async_rollouts_problem, generator_refusal, resolve_async_rollouts, snapshots_needed_by
from .episodes import AheadEpisodes
from .hf_sampling import padded_batch
from .protocols import AsyncRolloutHost
from .sampler_logps import completion_logps, sampled_logps_recorded
from .starts import generator_start

__all__ = ["AsyncRollouts", "async_rollouts_for", "importance_weight_share_changed"]


def importance_weight_share_changed(
    ratio: torch.Tensor, mask: torch.Tensor, mode: str, clip_min: float | None, clip_max: float | None
) -> float:
    """The share of completion tokens (or sequences, for the ``sequence_*`` modes) whose importance-sampling weight
    the correction changed: masked to 0 (``*_mask``, ``token_icepop``) or truncated at a bound (``*_truncate``)."""
    changed, counted = weight_share_changed(ratio, mask, mode, clip_min, clip_max)
    return changed / counted if counted else 0.0


def async_rollouts_for(host: AsyncRolloutHost, sampler_problem: str | None = None) -> AsyncRollouts | None:
    """The asynchronous side of ``host``'s rollouts, or ``None`` when it trains synchronously (``async_rollouts``:
    ``True`` is an error where the run cannot, ``None`` is on where it can and a warning where it cannot; what the
    chosen generator refuses counts as what the run cannot). ``sampler_problem``: why the sampler's log-probabilities
    cannot be compared with the policy's (its settings)."""
    zero_stage = getattr(getattr(host.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
    problem = (
        async_rollouts_problem(
            sharded=host.is_fsdp_enabled or (host.is_deepspeed_enabled and zero_stage == 3),
            vision_language=host._is_vlm,
            uses_vllm=host.use_vllm,
        )
        or sampler_problem
    )
    refusal = generator_refusal(host) if host.args.async_rollouts is not False else None
    if problem is None and refusal is not None and host.args.async_rollouts is True:
        raise ValueError(refusal)  # the generator's own words, as the config says them at construction
    on = resolve_async_rollouts(host.args.async_rollouts, problem or refusal, type(host.args))
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
        self._collecting: int | None = None  # the generation step whose sampled-ahead batch TRL is decoding
        self._turn = 0  # its turns so far (tool calls continue a rollout turn by turn)
        # the training process's weight transport: the in-process generator's, and what TRL's sync sends to a server
        self.model_swap = ModelSwap(
            lambda: trainable_parameters(host.model),
            lambda: self.behaviour.generation_steps - 1 if self.behaviour.generation_steps else None,
        )
        #: The episodes of environments for the batches sampled ahead, started at their submission.
        self.episodes = AheadEpisodes(host)
        samples_ahead = GENERATORS.get(host.args.async_generator).samples_ahead or self.snapshot_reason is None
        self.pipeline = self._ahead_pipeline() if samples_ahead else None
        if self.pipeline is not None:
            host.add_callback(self.pipeline)

    def _ahead_pipeline(self) -> AheadPipeline:
        """The pipeline that samples ahead, with the generator registered under ``async_generator``
        (``trl_reasoning.async_rollouts.starts``; :func:`async_rollouts_for` has checked that it can sample the run)."""
        host, args = self.host, self.host.args
        return AheadPipeline(
            self.behaviour,
            start_generator=generator_start(args.async_generator)(host, self.model_swap),
            prepare=self.episodes.prepare,
            seed_of=lambda step: job_seed(args.seed, step, 0, host.accelerator.process_index),
            current_weights=lambda: trainable_parameters(host.model),
            forget_prepared=self.episodes.forget,
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
            self.pipeline.submit(self.behaviour.generation_steps - 1, inputs)
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
        trainer's choice (``trainer.correction.ImportanceCorrection.importance_sampling_source``)."""
        host = self.host
        if not host.model.training:
            yield
            return
        saved = host.use_vllm
        host.use_vllm = True
        # a batch sampled ahead: TRL draws the environment instances whose episodes started at its submission
        sampled_ahead = self.pipeline is not None and self.generation_round == 0
        episodes = self.episodes.lent_to_trl(self.behaviour.generation_steps - 1) if sampled_ahead else None
        try:
            with episodes or contextlib.nullcontext():
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
                        # with tools a completion is several turns: one generate call's scores never cover it
                        logps = None if host.tools else completion_logps(records, generated[1])
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
        self._collecting, self._turn = step, 0  # TRL's tool loop samples later turns through later_turn
        try:
            generated = host.trl_generate(prompts)
        finally:
            host.rollout_func, host.use_vllm = own_rollout_func, backend
            self._collecting = None
        if host._engine_topk is not None and self.pipeline.last_ranked is not None:
            host._engine_topk.append(self.pipeline.last_ranked)  # DPPO top-K: the server's own
        # how much of the generator's time the trainer still waited for (0: fully overlapped)
        host._metrics["train"]["async/generation_seconds"].append(self.pipeline.last_generation_seconds)
        host._metrics["train"]["async/wait_seconds"].append(self.pipeline.last_wait_seconds)
        return generated

    def later_turn(self, prompt_ids: list[list[int]]) -> tuple[list, list] | None:
        """A later turn of the batch TRL is decoding from the generator that sampled it ahead (TRL's tool loop calls
        ``_generate_single_turn`` with each rollout's prompt, completion and tool response): by the same generator
        with the batch's own behaviour weights. ``None`` outside such a batch: TRL's own generation then runs."""
        if self._collecting is None:
            return None
        self._turn += 1
        return self.pipeline.sample_turn(self._collecting, prompt_ids, self._turn)

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
