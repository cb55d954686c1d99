"""TRL's vLLM server as the generator of asynchronous rollouts (``async_generator="server"``).

PipelineRL-k with a vLLM server (``use_vllm=True, vllm_mode="server"``): as soon as the behaviour weights of a
future batch exist (right after the optimizer step that produced them), they are pushed to the server with TRL's own
weight sync (``VLLMGeneration.sync_weights``) and the batch's prompts go out through TRL's own client
(``VLLMClient.generate``) from a background thread, so the server samples while the trainer trains the steps in
between. The log-probabilities the server returns are the behaviour policy's, as in TRL's synchronous vLLM path.

The server holds one set of weights, so a push first waits for the requests sampled with the previous set: at the
start of a run the first ``k + 1`` batches share the initial weights and go out together, afterwards one batch goes
out per step. Whatever else makes the server generate (an evaluation, an extra dynamic-sampling round, both TRL's
own synchronous path) first waits for the requests in flight (:meth:`ServerGenerator.release`).

Everything collective (gathering the ranks' prompts, broadcasting the completions, the weight sync) happens on the
training thread, at the same points on every rank; only the HTTP request runs in the background, on the main
process. A request that fails, or is not answered within ``timeout`` seconds of being sent (requests queued behind
it wait without a clock: a queue of slow healthy requests never fails), is a :class:`GeneratorError` on every rank.

A request can be abandoned (a ``train()`` that raised, then a new one) but not called back: until the server answers
it, no generator of the same client pushes weights (the next push first waits for it, at most ``timeout`` seconds),
and the interpreter waits for it at exit (at most until its ``timeout`` runs out), so that no request thread is left
running while Python shuts down.

Seams (``trl_reasoning.async_rollouts.protocols``): :class:`ServerGenerator` is a ``Generator``; its
``WeightTransport`` is :class:`ServerWeightSync`, which pushes a job's ``VersionedWeights`` with TRL's sync only when
their version is not the one on the server (after the requests in flight are answered), and forgets that version
whenever anything else may make the server sync (:meth:`ServerGenerator.release`).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from accelerate.utils import broadcast_object_list, gather_object

from ..algorithms.logprobs import engine_sampled_logprobs
from .protocols import (
    AsyncRolloutHost,
    GenerationJob,
    GeneratorError,
    GeneratorResult,
    VersionedWeights,
    VersionGate,
    WeightTransport,
)
from .starts import register_generator

#: ``VLLMGeneration`` attributes that give the sampling parameters of a request, read as its ``generate`` reads them.
SAMPLING_ATTRIBUTES = (
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_completion_length",
    "logprobs",
    "structured_outputs_regex",
    "generation_kwargs",
)


def sampling_parameters(vllm_generation: Any, num_generations: int) -> dict[str, Any]:
    """The keyword arguments of ``VLLMClient.generate`` that TRL's ``VLLMGeneration.generate`` sends (server mode)."""
    return {
        "n": num_generations,
        "repetition_penalty": vllm_generation.repetition_penalty,
        "temperature": vllm_generation.temperature,
        "top_p": vllm_generation.top_p,
        "top_k": vllm_generation.top_k,
        "min_p": 0.0 if vllm_generation.min_p is None else vllm_generation.min_p,
        "max_tokens": vllm_generation.max_completion_length,
        "logprobs": vllm_generation.logprobs,
        "structured_outputs_regex": vllm_generation.structured_outputs_regex,
        "generation_kwargs": vllm_generation.generation_kwargs,
    }


class ServerRequests:
    """The requests sent to one vLLM server (one client) and not answered yet, by every :class:`ServerGenerator` that
    used it (a closed one's included): ``sent[(generator id, step)]`` is when each went out. Its condition guards the
    generators' state too."""

    def __init__(self):
        self.changed = threading.Condition()
        self.sent: dict[tuple[int, int], float] = {}


_REQUESTS_BY_CLIENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GENERATORS: weakref.WeakSet = weakref.WeakSet()  # waited for at interpreter exit


def _requests_of(client: Any) -> ServerRequests:
    """The requests in flight on ``client``'s server (shared by every generator of the client)."""
    try:
        return _REQUESTS_BY_CLIENT.setdefault(client, ServerRequests())
    except TypeError:  # a client that cannot be weakly referenced: one ledger per generator
        return ServerRequests()


@atexit.register
def _wait_for_requests_at_exit() -> None:
    """No request thread runs while the interpreter shuts down (a thread in the middle of a request then can abort
    it): what is queued is dropped, what is on the server is waited for until its ``timeout`` runs out."""
    for generator in list(_GENERATORS):
        generator.close()
        generator.wait_for_thread()


class ServerWeightSync:
    """The ``WeightTransport`` of a vLLM server: ``push`` (TRL's weight sync, every rank) puts a job's weights on the
    server, after ``before_push`` (every rank: waiting for the requests sampled with the weights there now), only when
    their version is not the one last pushed."""

    def __init__(self, push: Callable[[VersionedWeights], None], before_push: Callable[[], None]):
        self._push, self._before_push = push, before_push
        self._gate = VersionGate(self._ship)

    def _ship(self, weights: VersionedWeights) -> None:
        self._before_push()
        self._push(weights)

    @property
    def held_version(self) -> int | None:
        """The version on the server (``None``: unknown, the next job's weights are pushed)."""
        return self._gate.held_version

    @contextlib.contextmanager
    def holding(self, weights: VersionedWeights) -> Iterator[None]:
        self._gate.update(weights)
        yield

    def forget(self) -> None:
        self._gate.forget()


class ServerGenerator:
    """The generator of :class:`~trl_reasoning.async_rollouts.pipeline.AheadPipeline` for a vLLM server: the same
    ``submit`` / ``result`` / ``close`` as :class:`~trl_reasoning.async_rollouts.process_generator.GeneratorProcess`.

    Args:
        vllm_generation: the trainer's ``VLLMGeneration`` (server mode): its client and sampling settings.
        accelerator: the trainer's accelerator (the ranks' prompts are gathered, the completions broadcast).
        push_weights: puts the given behaviour weights on the server (TRL's weight sync with them swapped in); called
            by :class:`ServerWeightSync` only when their version changes.
        num_generations: completions per prompt.
        timeout: seconds to wait for a request before a :class:`GeneratorError`.
    """

    def __init__(
        self,
        *,
        vllm_generation: Any,
        accelerator: Any,
        push_weights: Callable[[VersionedWeights], None],
        num_generations: int,
        timeout: float,
    ):
        self._vllm = vllm_generation
        self._accelerator = accelerator
        self._num_generations = num_generations
        self.timeout = timeout
        self.transport = ServerWeightSync(push_weights, before_push=self.release)
        self._rows: dict[int, int] = {}  # generation step -> this rank's rows
        self.submitted: set[int] = set()
        self._requests: queue.Queue = queue.Queue()
        self._answers: dict[int, tuple] = {}
        self._in_flight: set[int] = set()  # submitted and not answered: queued, or sent (in ``_ledger.sent``)
        self._ledger = _requests_of(vllm_generation.vllm_client)
        self._changed = self._ledger.changed
        self._thread: threading.Thread | None = None
        self._closed = False
        #: ``(completion_ids, ranked log-probs, ranked token ids)`` of the last batch returned, when the server
        #: reported more than the sampled token (DPPO top-K's ``logprobs=K``): the engine's own top-K.
        self.last_ranked: tuple[list, list, list] | None = None

    @property
    def _main(self) -> bool:
        return self._accelerator.is_main_process

    # -------------------------------------------------------------------------------------------- training thread
    def submit(self, job: GenerationJob) -> None:
        """Send the batch of ``job.step`` (every rank's rows, gathered) with its behaviour weights, once."""
        if job.step in self.submitted:
            return
        all_prompt_ids = gather_object(job.prompt_ids)
        with self.transport.holding(job.weights):
            if self._main:
                self._start_thread()
                with self._changed:
                    self._in_flight.add(job.step)
                if job.later_turn:  # each rollout's own history: one completion per row, as TRL's loop asks
                    self._requests.put((job.step, all_prompt_ids, 1))
                else:  # the prompts, each repeated per generation: one request with n completions per prompt
                    self._requests.put((job.step, all_prompt_ids[:: self._num_generations], self._num_generations))
        self.submitted.add(job.step)
        self._rows[job.step] = len(job.prompt_ids)

    def result(self, step: int) -> GeneratorResult:
        """``(completions, sampled-token log-probs, seconds the server took, seconds this call waited)`` for this
        rank's rows of generation ``step``."""
        started = time.perf_counter()
        payload: Any = None
        if self._main:
            try:
                payload = self._answer(step)
            except GeneratorError as error:
                payload = str(error)  # every rank raises it, none waits in a collective the others left
        box = [payload]
        broadcast_object_list(box, from_process=0)
        payload = box[0]
        self.submitted.discard(step)
        if isinstance(payload, str):
            raise GeneratorError(payload)
        completion_ids, logprobs, token_ids, seconds = payload
        rows = self._rows.pop(step)
        mine = slice(self._accelerator.process_index * rows, (self._accelerator.process_index + 1) * rows)
        completions, ranked_logps = completion_ids[mine], logprobs[mine]
        if token_ids is None:  # logprobs=0: entry 0 of each position is the sampled token's, as TRL's path keeps it
            logps = [[entry[0] for entry in sequence] for sequence in ranked_logps]
            self.last_ranked = None
        else:  # with logprobs=K (DPPO top-K) entry 0 is the most likely token's: look the sampled one up
            logps = engine_sampled_logprobs(completions, ranked_logps, token_ids[mine])
            self.last_ranked = (completions, ranked_logps, token_ids[mine])
        return completions, logps, seconds, time.perf_counter() - started

    def release(self) -> None:
        """Wait for every request in flight, this generator's and those a closed one left on the server; afterwards
        the weights on the server are treated as unknown (the next submission pushes its own). Call it (on every rank)
        before anything else makes the server sample or changes its weights. A request not answered within
        ``timeout`` seconds of its sending (a left one: of this wait's start) is a ``GeneratorError`` on every rank."""
        error = None
        if self._main:
            started = time.monotonic()
            with self._changed:
                while error is None:
                    left = sorted(step for owner, step in self._ledger.sent if owner != id(self))
                    if not self._in_flight and not left:
                        break
                    late = self._late_request()
                    if late is not None:
                        error = (
                            f"The vLLM server did not answer the requests of generation steps {sorted(self._in_flight)} "
                            f"within {self.timeout:g} s of each one's sending (async_timeout; step {late} is late). "
                            "Check that it runs; raise async_timeout if generation is that slow."
                        )
                    elif left and time.monotonic() - started > self.timeout:
                        error = (
                            f"The vLLM server still samples the requests of generation steps {left} that an earlier "
                            f"train() left on it, {self.timeout:g} s later (async_timeout): no weights are pushed while "
                            "a request samples. Check that the server runs, or restart it."
                        )
                    else:
                        self._changed.wait(timeout=self._seconds_to_next_deadline())
        box = [error]
        broadcast_object_list(box, from_process=0)  # no rank goes on to a collective the main one left
        self.transport.forget()
        if box[0] is not None:
            raise GeneratorError(box[0])

    def close(self) -> None:
        """Send nothing more: the requests still queued are dropped; the thread ends at once when no request of this
        generator is on the server, else when the server answers it (abandoned: the next push, by any generator of
        this client, and the interpreter's exit wait for it)."""
        self._closed = True
        if self._thread is None:
            return
        with self._changed:
            while True:
                try:
                    step = self._requests.get_nowait()
                except queue.Empty:
                    break
                if step is not None:
                    self._in_flight.discard(step[0])
            self._requests.put(None)
            busy = any(owner == id(self) for owner, _ in self._ledger.sent)
        if not busy:
            self._thread.join(timeout=5.0)

    @property
    def alive(self) -> bool:
        """Whether it still sends requests (until :meth:`close`)."""
        return not self._closed

    def wait_for_thread(self) -> None:
        """Wait for the request thread to end, at most until the request it is on runs out of ``timeout``."""
        thread = self._thread
        if thread is None:
            return
        with self._changed:
            sent = [at for (owner, _), at in self._ledger.sent.items() if owner == id(self)]
        thread.join(timeout=max(sent[0] + self.timeout - time.monotonic(), 0.0) if sent else 5.0)

    def _answer(self, step: int) -> tuple:
        with self._changed:
            while step not in self._answers:
                if step not in self._in_flight:
                    raise GeneratorError(f"generation step {step} was never sent to the vLLM server")
                late = self._late_request()
                if late is not None:
                    raise GeneratorError(
                        f"The vLLM server did not return the batch of generation step {late} within {self.timeout:g} s "
                        f"of its sending (async_timeout){'' if late == step else f', before step {step} could go'}. "
                        "Check that it runs; raise async_timeout if generation is that slow."
                    )
                self._changed.wait(timeout=self._seconds_to_next_deadline())
            answer = self._answers.pop(step)
        if isinstance(answer, str):
            raise GeneratorError(f"The vLLM server's request for generation step {step} failed:\n{answer}")
        return answer

    def _late_request(self) -> int | None:
        """A request of this generator on the server for longer than ``timeout`` (under ``_changed``)."""
        now = time.monotonic()
        late = [
            step for (owner, step), at in self._ledger.sent.items() if owner == id(self) and now - at > self.timeout
        ]
        return min(late) if late else None

    def _seconds_to_next_deadline(self) -> float:
        """How long a wait may sleep before a request of this generator may be late (under ``_changed``)."""
        now = time.monotonic()
        left = [at + self.timeout - now for (owner, _), at in self._ledger.sent.items() if owner == id(self)]
        return min(max(min(left, default=1.0), 0.0) + 0.01, 1.0)

    # ------------------------------------------------------------------------------------------ background thread
    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="trl-reasoning-vllm-requests", daemon=True)
            self._thread.start()
            _GENERATORS.add(self)

    def _serve(self) -> None:
        parameters = sampling_parameters(self._vllm, self._num_generations)
        while True:
            request = self._requests.get()
            if request is None:
                return
            step, prompt_ids, completions_per_prompt = request
            with self._changed:
                if step not in self._in_flight:  # dropped by close() meanwhile
                    continue
                self._ledger.sent[(id(self), step)] = time.monotonic()  # its timeout starts now
            started = time.perf_counter()
            try:
                output = self._vllm.vllm_client.generate(
                    prompts=prompt_ids, **{**parameters, "n": completions_per_prompt}
                )
                answer: Any = (
                    output["completion_ids"],
                    output["logprobs"],
                    output.get("logprob_token_ids"),
                    time.perf_counter() - started,
                )
            except Exception:
                answer = traceback.format_exc()
            with self._changed:
                self._answers[step] = answer
                self._in_flight.discard(step)
                self._ledger.sent.pop((id(self), step), None)
                self._changed.notify_all()


def push_behaviour_weights(host: AsyncRolloutHost, model_swap: WeightTransport, weights: VersionedWeights) -> None:
    """``async_generator="server"`` (called by its transport when the version changes): TRL's weight sync with
    ``weights`` in the model (``ModelSwap``: the model's own weights are pushed as they are); TRL's own paths sync the
    current weights again before they next sample (evaluation)."""
    with model_swap.holding(weights):
        host.vllm_generation.sync_weights()
    host._last_loaded_step = -1


@register_generator("server")
def start_server_generator(host: AsyncRolloutHost, model_swap: WeightTransport) -> Callable[[], ServerGenerator]:
    """A :class:`ServerGenerator`: TRL's vLLM server, pushed each batch's behaviour weights (put in the trainer's model
    by ``model_swap``, sent from there by TRL's weight sync) and sent its prompts ahead of the trainer."""
    args = host.args

    def start_generator() -> ServerGenerator:
        return ServerGenerator(
            vllm_generation=host.vllm_generation,
            accelerator=host.accelerator,
            push_weights=lambda weights: push_behaviour_weights(host, model_swap, weights),
            num_generations=host.num_generations,
            timeout=args.async_timeout,
        )

    return start_generator
