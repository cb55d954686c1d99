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
process. A request that fails, or does not answer within ``timeout`` seconds, is a :class:`GeneratorError` on every
rank.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from .generator_process import GenerationJob, GeneratorError
from .logits import engine_sampled_logprobs

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


class ServerGenerator:
    """The generator of :class:`~trl_reasoning.async_rollouts.AheadPipeline` for a vLLM server: the same
    ``submit`` / ``result`` / ``close`` as :class:`~trl_reasoning.generator_process.GeneratorProcess`.

    Args:
        vllm_generation: the trainer's ``VLLMGeneration`` (server mode): its client and sampling settings.
        accelerator: the trainer's accelerator (the ranks' prompts are gathered, the completions broadcast).
        push_weights: puts the given behaviour weights on the server (TRL's weight sync with them swapped in).
        num_generations: completions per prompt.
        timeout: seconds to wait for a request before a :class:`GeneratorError`.
    """

    def __init__(
        self,
        *,
        vllm_generation: Any,
        accelerator: Any,
        push_weights: Callable[[dict[str, torch.Tensor]], None],
        num_generations: int,
        timeout: float,
    ):
        self._vllm = vllm_generation
        self._accelerator = accelerator
        self._push_weights = push_weights
        self._num_generations = num_generations
        self.timeout = timeout
        self._on_server: dict[str, torch.Tensor] | None = None  # the snapshot last pushed; None: unknown
        self._rows: dict[int, int] = {}  # generation step -> this rank's rows
        self.submitted: set[int] = set()
        self._requests: queue.Queue = queue.Queue()
        self._answers: dict[int, tuple] = {}
        self._in_flight: set[int] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
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
        if job.weights is not self._on_server:
            self.release()
            self._push_weights(job.weights)
            self._on_server = job.weights
        if self._main:
            self._start_thread()
            with self._changed:
                self._in_flight.add(job.step)
            self._requests.put((job.step, all_prompt_ids[:: self._num_generations]))
        self.submitted.add(job.step)
        self._rows[job.step] = len(job.prompt_ids)

    def result(self, step: int) -> tuple[list[list[int]], list[list[float]], float, float]:
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
        """Wait for every request in flight; afterwards the weights on the server are treated as unknown (the next
        submission pushes its own). Call it (on every rank) before anything else makes the server sample or changes
        its weights. A server that does not answer in time is a ``GeneratorError`` on every rank."""
        error = None
        if self._main:
            deadline = time.monotonic() + self.timeout
            with self._changed:
                while self._in_flight and error is None:
                    if not self._changed.wait(timeout=max(deadline - time.monotonic(), 0.0)):
                        error = (
                            f"The vLLM server did not answer the requests of generation steps {sorted(self._in_flight)} "
                            f"within {self.timeout:g} s (async_timeout). Check that it runs; raise async_timeout if "
                            "generation is that slow."
                        )
        box = [error]
        broadcast_object_list(box, from_process=0)  # no rank goes on to a collective the main one left
        self._on_server = None
        if box[0] is not None:
            raise GeneratorError(box[0])

    def close(self) -> None:
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(timeout=1.0)  # a request still in flight ends on its own (the thread is a daemon)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive()

    def _answer(self, step: int) -> tuple:
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while step not in self._answers:
                if step not in self._in_flight:
                    raise GeneratorError(f"generation step {step} was never sent to the vLLM server")
                if not self._changed.wait(timeout=max(deadline - time.monotonic(), 0.0)):
                    raise GeneratorError(
                        f"The vLLM server did not return the batch of generation step {step} within "
                        f"{self.timeout:g} s (async_timeout). Check that it runs; raise async_timeout if generation "
                        "is that slow."
                    )
            answer = self._answers.pop(step)
        if isinstance(answer, str):
            raise GeneratorError(f"The vLLM server's request for generation step {step} failed:\n{answer}")
        return answer

    # ------------------------------------------------------------------------------------------ background thread
    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="trl-reasoning-vllm-requests", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        parameters = sampling_parameters(self._vllm, self._num_generations)
        while True:
            request = self._requests.get()
            if request is None:
                return
            step, prompt_ids = request
            started = time.perf_counter()
            try:
                output = self._vllm.vllm_client.generate(prompts=prompt_ids, **parameters)
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
                self._changed.notify_all()
