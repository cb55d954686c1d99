"""A generator in its own process, for asynchronous rollouts (``async_generator="process"``).

The trainer submits a :class:`GenerationJob` for a future batch as soon as it knows the batch's prompts and its
behaviour weights (the snapshot of ``max_staleness`` generation steps earlier); the worker samples it with HF
``generate`` while the trainer trains the steps in between, and returns the completions and the sampled tokens'
log-probabilities under those weights. Every job carries its own seed, so what comes back depends only on
``(weights, prompts, seed)``: the same batch as the in-process generator (``"inline"``) samples with the same seed,
whatever the timing — which makes the pipeline reproducible, resumable (an in-flight job is resubmitted), and
testable against the in-process emulation.

The worker holds its own copy of the model (rebuilt from the config and the weights, with the PEFT adapters of a
LoRA run); a job ships only the trainable weights, in shared memory. It knows nothing of trainers or TRL: the
generation is written here as TRL 1.16's ``GRPOTrainer._generate_single_turn`` does it with ``generate`` (prompts
left-padded, every token after the first EOS dropped).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import queue
import sys
import time
import traceback
from typing import Any

import torch


@dataclasses.dataclass
class GenerationJob:
    """One batch to sample: ``prompt_ids`` (this process's rows), the behaviour weights, the seed."""

    step: int
    prompt_ids: list[list[int]]
    weights: dict[str, torch.Tensor]
    seed: int


@dataclasses.dataclass
class SamplingSettings:
    """What the worker needs to sample and score as the trainer would."""

    generation_config: Any
    pad_token_id: int
    eos_token_ids: list[int]
    temperature: float
    pad_to_multiple_of: int | None
    batch_size: int
    threads: int = 1
    device: str = "cpu"  # where the worker's copy of the model samples (the trainer's device)


#: Seconds a new worker may take to import torch and build its model (at least; ``async_timeout`` if longer).
STARTUP_TIMEOUT = 300.0


class GeneratorError(RuntimeError):
    """The generator process failed, died or did not answer in time."""


def model_recipe(model: torch.nn.Module) -> dict[str, Any]:
    """How to rebuild ``model`` in another process: its config, its generation config, its PEFT config (if any) and
    its weights (CPU)."""
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise ValueError("a quantized (bitsandbytes) model cannot be copied into a generator process")
    peft_config = None
    base = model
    if hasattr(model, "peft_config"):
        peft_config = model.peft_config[model.active_adapter]
        base = model.get_base_model()
    return {
        "config": base.config,
        # generate() takes every setting the trainer's GenerationConfig leaves unset from the model's own; a model
        # built from its config alone would derive it from the config, where the Trainer has set use_cache=False
        # (a training setting): the worker would then sample without a KV cache, ~5x slower on SmolLM2-135M.
        "generation_config": copy.deepcopy(getattr(base, "generation_config", None)),
        "peft_config": peft_config,
        "state_dict": {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()},
    }


def _rebuild(recipe: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(recipe["config"])
    if recipe["generation_config"] is not None:
        model.generation_config = recipe["generation_config"]
    if recipe["peft_config"] is not None:
        from peft import get_peft_model

        model = get_peft_model(model, recipe["peft_config"])
    missing, unexpected = model.load_state_dict(recipe["state_dict"], strict=False)
    missing = [name for name in missing if not name.endswith("lm_head.weight")]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"the generator's model does not match the trainer's: {missing[:3]} {unexpected[:3]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def _padded(rows: list[list[int]], value: int, side: str, multiple: int | None) -> torch.Tensor:
    from trl.trainer.utils import pad

    return pad([torch.tensor(row, dtype=torch.long) for row in rows], value, side, multiple)


@torch.no_grad()
def sample(model: torch.nn.Module, prompt_ids: list[list[int]], settings: SamplingSettings) -> list[list[int]]:
    """``generate`` as TRL's ``_generate_single_turn`` calls it; each completion ends at its first EOS."""
    input_ids = _padded(prompt_ids, settings.pad_token_id, "left", settings.pad_to_multiple_of).to(settings.device)
    attention_mask = _padded([[1] * len(ids) for ids in prompt_ids], 0, "left", settings.pad_to_multiple_of)
    attention_mask = attention_mask.to(settings.device)
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, generation_config=settings.generation_config
    )
    completions = []
    for row in output[:, input_ids.size(1) :].tolist():
        ends = [i for i, token in enumerate(row) if token in settings.eos_token_ids]
        completions.append(row[: ends[0] + 1] if ends else row)
    return completions


def padded_batch(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_token_id: int, multiple: int | None
) -> dict[str, torch.Tensor]:
    """Prompts left-padded and completions right-padded, with their masks, as TRL lays out a scored batch."""
    return {
        "prompt_ids": _padded(prompt_ids, pad_token_id, "left", multiple),
        "prompt_mask": _padded([[1] * len(ids) for ids in prompt_ids], 0, "left", multiple),
        "completion_ids": _padded(completion_ids, pad_token_id, "right", multiple),
        "completion_mask": _padded([[1] * len(ids) for ids in completion_ids], 0, "right", multiple),
    }


@torch.no_grad()
def sampled_token_logps(
    model: torch.nn.Module, prompt_ids: list[list[int]], completion_ids: list[list[int]], settings: SamplingSettings
) -> list[list[float]]:
    """``log softmax(logits / temperature)`` at each sampled token, the batch laid out as TRL lays it out."""
    batch = padded_batch(prompt_ids, completion_ids, settings.pad_token_id, settings.pad_to_multiple_of)
    batch = {key: value.to(settings.device) for key, value in batch.items()}
    completions = batch["completion_ids"]
    input_ids = torch.cat([batch["prompt_ids"], completions], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    length = completions.size(1)
    rows = []
    for start in range(0, input_ids.size(0), settings.batch_size):
        chunk = slice(start, start + settings.batch_size)
        logits = model(input_ids=input_ids[chunk], attention_mask=attention_mask[chunk]).logits
        logits = logits[:, -length - 1 : -1].float() / settings.temperature
        rows.append(torch.log_softmax(logits, dim=-1).gather(-1, completions[chunk].unsqueeze(-1)).squeeze(-1))
    logps = torch.cat(rows)
    return [row[: len(ids)].tolist() for row, ids in zip(logps, completion_ids, strict=True)]


def packed(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``weights`` as one flat shared-memory tensor per dtype, with each tensor's name and shape: one shared block (one
    file descriptor) per job instead of one per tensor, whose count would grow with the model and ``max_staleness``."""
    groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in weights.items():
        groups.setdefault(tensor.dtype, []).append((name, tensor.detach().to("cpu")))
    return {
        "flat": [torch.cat([t.reshape(-1) for _, t in items]).share_memory_() for items in groups.values()],
        "layout": [[(name, tuple(t.shape)) for name, t in items] for items in groups.values()],
    }


def unpacked(weights: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`packed` (views into the shared blocks)."""
    tensors = {}
    for flat, layout in zip(weights["flat"], weights["layout"], strict=True):
        offset = 0
        for name, shape in layout:
            size = math.prod(shape)
            tensors[name] = flat[offset : offset + size].view(shape)
            offset += size
    return tensors


def _worker(recipe: dict[str, Any], settings: SamplingSettings, jobs, results) -> None:
    torch.set_num_threads(settings.threads)
    try:
        model = _rebuild(recipe).to(settings.device)
        params = dict(model.named_parameters())
    except BaseException:
        results.put((-1, None, None, traceback.format_exc()))
        return
    results.put((-1, None, None, 0.0))  # ready
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            with torch.no_grad():
                for name, tensor in unpacked(job.weights).items():
                    params[name].copy_(tensor)
            started = time.perf_counter()
            torch.manual_seed(job.seed)
            completions = sample(model, job.prompt_ids, settings)
            logps = sampled_token_logps(model, job.prompt_ids, completions, settings)
            results.put((job.step, completions, logps, time.perf_counter() - started))
        except BaseException:
            results.put((job.step, None, None, traceback.format_exc()))  # a string: the error


@contextlib.contextmanager
def _main_module_hidden():
    """A spawned process re-runs the parent's main script (to find functions defined there) unless that script is
    guarded by ``if __name__ == "__main__"`` — which training scripts often are not. The worker needs nothing from
    it (its function lives in this module), so the main module's file and spec are hidden while it starts."""
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__.pop(key) for key in ("__file__", "__spec__") if main and key in main.__dict__}
    if main is not None and "__spec__" in saved:
        main.__spec__ = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


class GeneratorProcess:
    """The worker process and its two queues. ``submit`` a job, ``result(step)`` waits for it (at most ``timeout``
    seconds, checking every second that the worker lives); ``close`` stops it."""

    def __init__(self, model: torch.nn.Module, settings: SamplingSettings, timeout: float):
        context = torch.multiprocessing.get_context("spawn")
        self.timeout = timeout
        self._jobs = context.Queue()
        self._results = context.Queue()
        self._done: dict[int, tuple] = {}
        self.submitted: set[int] = set()
        self._packed: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None  # the last weights shipped, packed
        self._process = context.Process(
            target=_worker, args=(model_recipe(model), settings, self._jobs, self._results), daemon=True
        )
        with _main_module_hidden():
            self._process.start()
        self._wait_for(-1, timeout=max(timeout, STARTUP_TIMEOUT))  # importing torch and building the model

    def submit(self, job: GenerationJob) -> None:
        if job.step in self.submitted:
            return
        if self._packed is None or self._packed[0] is not job.weights:  # the jobs of one step share their weights
            self._packed = (job.weights, packed(job.weights))
        self._jobs.put(dataclasses.replace(job, weights=self._packed[1]))
        self.submitted.add(job.step)

    def result(self, step: int) -> tuple[list[list[int]], list[list[float]], float, float]:
        """``(completions, log-probs, seconds the worker spent on it, seconds this call waited for it)``."""
        started = time.perf_counter()
        completions, logps, seconds = self._wait_for(step)
        self.submitted.discard(step)
        return completions, logps, seconds, time.perf_counter() - started

    def _wait_for(self, step: int, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while step not in self._done:
            if not self._process.is_alive():
                raise GeneratorError(
                    f"The generator process died (exit code {self._process.exitcode}) before it returned the batch of "
                    f"generation step {step}. Its error, if it printed one, is above; async_generator='inline' "
                    "generates in the training process instead."
                )
            if time.monotonic() > deadline:
                what = "start" if step < 0 else f"return the batch of generation step {step}"
                raise GeneratorError(
                    f"The generator process did not {what} within {timeout:g} s (async_timeout={self.timeout:g}). "
                    "Raise async_timeout if generation is that slow."
                )
            try:
                answer = self._results.get(timeout=1.0)
            except queue.Empty:
                continue
            self._done[answer[0]] = answer
        _, completions, logps, seconds = self._done.pop(step)
        if isinstance(seconds, str):
            raise GeneratorError(f"The generator process failed on generation step {step}:\n{seconds}")
        return completions, logps, seconds

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._jobs.put(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()
