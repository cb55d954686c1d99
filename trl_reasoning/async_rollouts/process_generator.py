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

Seams (``trl_reasoning.async_rollouts.protocols``): :class:`GeneratorProcess` is a ``Generator``; its
``WeightTransport`` is :class:`SharedMemoryTransport`, which packs a job's ``VersionedWeights`` into one shared block
per dtype only when their version changes (the jobs of one step share one block). What crosses the queue is a
:class:`WorkerJob`, the job with that block.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..models.varlen_attention import base_implementation
from .behaviour import host_snapshot
from .hf_sampling import SamplingSettings, sample, sampling_settings
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


@dataclasses.dataclass
class WorkerJob:
    """A :class:`~trl_reasoning.async_rollouts.protocols.GenerationJob` as it crosses to the worker: its weights are
    the shared-memory block of :func:`packed` (see :class:`SharedMemoryTransport`)."""

    step: int
    prompt_ids: list[list[int]]
    packed_weights: dict[str, Any]
    seed: int


#: Seconds a new worker may take to import torch and build its model (at least; ``async_timeout`` if longer).
STARTUP_TIMEOUT = 300.0
#: Seconds between two checks, while the trainer waits, that the worker lives and runs.
POLL_SECONDS = 0.5
#: Seconds a worker must be seen stopped before a wait reports it: a job suspended and resumed whole (the trainer and
#: its worker stopped, then continued by one signal to their group) may show the worker stopped for an instant longer.
STOPPED_GRACE_SECONDS = 2.0


def process_state(pid: int) -> str | None:
    """How the kernel sees process ``pid``: ``"stopped"`` (by a signal: SIGSTOP, or SIGTSTP, SIGTTIN, SIGTTOU of job
    control), ``"traced"`` (held by a debugger or tracer), ``"zombie"`` (exited, not reaped yet), ``"running"`` (running
    or sleeping: anything else), or ``None`` where that cannot be read (no such process; neither ``/proc`` nor psutil).

    A stopped worker neither answers nor dies: without this a wait learns of it only at ``async_timeout`` (600 s by
    default) and blames slow generation. ``/proc/<pid>/stat`` on Linux (no dependency); elsewhere psutil (which
    accelerate, a dependency, installs), if importable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")"
            letter = stat.read().rpartition(b")")[2].split()[0].decode()
        return {"T": "stopped", "t": "traced", "Z": "zombie", "X": "zombie"}.get(letter, "running")
    except (OSError, IndexError, UnicodeDecodeError):
        pass
    try:
        import psutil

        status = psutil.Process(pid).status()
    except Exception:  # noqa: BLE001 - best effort: no psutil, no such process, no permission
        return None
    names = {psutil.STATUS_STOPPED: "stopped", psutil.STATUS_TRACING_STOP: "traced", psutil.STATUS_ZOMBIE: "zombie"}
    return names.get(status, "running")


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
    config = base.config
    if base_implementation(base) != config._attn_implementation:
        # the trainer's packed attention (padding_free) is registered in its own process only; the worker generates
        # unpacked, which is the base implementation's forward
        config = copy.deepcopy(config)
        config._attn_implementation_internal = base_implementation(base)
    return {
        "config": config,
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


def packed(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``weights`` as one flat shared-memory tensor per dtype, with each tensor's name and shape: one shared block (one
    file descriptor) per job instead of one per tensor, whose count would grow with the model and ``max_staleness``."""
    # Weights on a GPU cross as one snapshot (pinned, queued, waited for once), as the in-process pipeline keeps them;
    # weights already on the CPU are read where they are: the concatenation below copies them anyway.
    on_host = host_snapshot({name: tensor for name, tensor in weights.items() if tensor.is_cuda})
    groups: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in weights.items():
        groups.setdefault(tensor.dtype, []).append((name, on_host.get(name, tensor.detach())))
    return {
        "flat": [torch.cat([t.reshape(-1) for _, t in items]).share_memory_() for items in groups.values()],
        "layout": [[(name, tuple(t.shape)) for name, t in items] for items in groups.values()],
    }


class SharedMemoryTransport:
    """The ``WeightTransport`` of a worker process: the block of :func:`packed` the next jobs carry, packed again only
    when a job's weights have another version than the block's (the jobs of one step share one block)."""

    def __init__(self):
        self.block: dict[str, Any] | None = None
        self._gate = VersionGate(self._pack)

    def _pack(self, weights: VersionedWeights) -> None:
        self.block = packed(dict(weights.tensors))

    @property
    def held_version(self) -> int | None:
        """The version of :attr:`block` (``None``: none packed yet)."""
        return self._gate.held_version

    @contextlib.contextmanager
    def holding(self, weights: VersionedWeights) -> Iterator[dict[str, Any]]:
        """Yields the shared block that holds ``weights`` (packed now only if their version is new)."""
        self._gate.update(weights)
        yield self.block

    def forget(self) -> None:
        self._gate.forget()


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


#: ``prctl`` option: the signal the kernel sends this process when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1
#: Seconds between two checks, in the worker, that its trainer still lives (where the kernel does not tell it).
PARENT_POLL_SECONDS = 0.5


def _exit_with_parent(parent_pid: int) -> None:
    """End this process as soon as the trainer that started it dies, by whatever signal (SIGKILL, an OOM kill
    included): on Linux the kernel kills it (``PR_SET_PDEATHSIG``); everywhere a daemon thread also checks every
    :data:`PARENT_POLL_SECONDS` that its parent is still ``parent_pid`` (an orphan is adopted by another process).

    ``PR_SET_PDEATHSIG`` fires when the *thread* that started the worker ends: the trainer starts it on its training
    thread, which outlives it (``train()`` stops it at its end, and the next ``train()`` stops one a failed run left)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)  # nothing to flush: the trainer, the only reader of the results, is gone

    if os.getppid() != parent_pid:  # it died before the kernel was told
        os._exit(1)
    threading.Thread(target=watch, name="trl-reasoning-parent-watch", daemon=True).start()


def _worker(recipe: dict[str, Any], settings: SamplingSettings, jobs, results, parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    # Ctrl-C belongs to the trainer, which stops this worker itself (the terminal sends SIGINT to both).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
                for name, tensor in unpacked(job.packed_weights).items():
                    params[name].copy_(tensor)
            started = time.perf_counter()
            torch.manual_seed(job.seed)
            completions, logps = sample(model, job.prompt_ids, settings)
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


@contextlib.contextmanager
def _children_detached(log_path: str | None):
    """Processes started within the block write their output to ``log_path`` (``os.devnull`` when ``None`` or
    unwritable), not to this process's stdout and stderr, and ignore SIGINT.

    A spawned process inherits the parent's file descriptors 1 and 2 and the signals it ignores, from the moment it
    exists (seconds before any code of ours runs in it, while it imports torch): the descriptors are pointed at the log
    for the few milliseconds of the start, so that a supervisor reading this process's output to its end (a pipe, a
    CI log) never waits for a child; SIGINT is ignored (and blocked, so that a Ctrl-C in the meantime reaches this
    process when the block ends) because a Ctrl-C sent to the terminal's process group is this process's to handle
    by stopping its children. Python's errors cross to the trainer through the results queue, not through stderr."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # what was printed before goes where it was meant to
    saved: dict[int, int] = {}
    target = None
    try:
        with contextlib.suppress(OSError):
            target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log_path else None
        if target is None:
            target = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # a closed descriptor stays closed
                saved[fd] = os.dup(fd)
                os.dup2(target, fd)
    except BaseException:
        for fd, copy_of in saved.items():
            os.dup2(copy_of, fd)
            os.close(copy_of)
        raise
    on_main_thread = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    if on_main_thread:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a blocked SIGINT stays pending on Linux
    try:
        yield
    finally:
        if on_main_thread:
            signal.signal(signal.SIGINT, signal.default_int_handler if handler is None else handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending Ctrl-C is a KeyboardInterrupt here
        for fd, copy_of in saved.items():
            os.dup2(copy_of, fd)
            os.close(copy_of)
        os.close(target)


class GeneratorProcess:
    """The worker process and its two queues. ``submit`` a job, ``result(step)`` waits for it (at most ``timeout``
    seconds, checking every :data:`POLL_SECONDS` that the worker lives and runs: a dead worker is an error at once, a
    stopped one after :data:`STOPPED_GRACE_SECONDS`); ``close`` stops it.

    The worker never outlives this process (it exits within a second of its death by any signal), writes its output
    to ``log_path`` (``None``: nowhere) rather than to this process's stdout and stderr, and leaves Ctrl-C to this
    process: an interrupt while it starts stops it before the ``KeyboardInterrupt`` goes on."""

    last_ranked = None  # HF generate reports no top-K of its own

    def __init__(
        self, model: torch.nn.Module, settings: SamplingSettings, timeout: float, log_path: str | None = None
    ):
        context = torch.multiprocessing.get_context("spawn")
        self.timeout = timeout
        self.log_path = log_path
        self._done: dict[int, tuple] = {}
        self.submitted: set[int] = set()
        self._process = None
        self.transport = SharedMemoryTransport()
        self._ready = False
        try:
            recipe = model_recipe(model)
            # the queues' semaphores may start multiprocessing's resource tracker: detached too
            with _children_detached(log_path):
                self._jobs = context.Queue()
                self._results = context.Queue()
                self._process = context.Process(
                    target=_worker,
                    args=(recipe, settings, self._jobs, self._results, os.getpid()),
                    daemon=True,
                )
                with _main_module_hidden():
                    self._process.start()
            self._wait_for(-1, timeout=max(timeout, STARTUP_TIMEOUT))  # importing torch and building the model
            self._ready = True
        except BaseException:  # KeyboardInterrupt included: no worker is left behind, not even a zombie
            self.close()
            raise

    def submit(self, job: GenerationJob) -> None:
        if job.step in self.submitted:
            return
        with self.transport.holding(job.weights) as block:
            self._jobs.put(WorkerJob(job.step, job.prompt_ids, block, job.seed))
        self.submitted.add(job.step)

    def release(self) -> None:
        """Nothing to wait for: the worker's weights change only with the jobs it is sent."""

    def result(self, step: int) -> GeneratorResult:
        """``(completions, log-probs, seconds the worker spent on it, seconds this call waited for it)``."""
        started = time.perf_counter()
        completions, logps, seconds = self._wait_for(step)
        self.submitted.discard(step)
        return completions, logps, seconds, time.perf_counter() - started

    def _wait_for(self, step: int, timeout: float | None = None):
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        stopped_since = None
        while step not in self._done:
            stopped_since = self._check_worker(step, stopped_since)
            if time.monotonic() > deadline:
                what = "start" if step < 0 else f"return the batch of generation step {step}"
                traced = process_state(self._process.pid) == "traced"
                raise GeneratorError(
                    f"The generator process did not {what} within {timeout:g} s (async_timeout={self.timeout:g})"
                    + (f": a debugger holds it (pid {self._process.pid}, tracing stop)." if traced else ".")
                    + " Raise async_timeout if generation is that slow."
                )
            try:
                answer = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            self._done[answer[0]] = answer
        _, completions, logps, seconds = self._done.pop(step)
        if isinstance(seconds, str):
            raise GeneratorError(f"The generator process failed on generation step {step}:\n{seconds}")
        return completions, logps, seconds

    def _check_worker(self, step: int, stopped_since: float | None) -> float | None:
        """Raise if the worker died, or has been stopped for :data:`STOPPED_GRACE_SECONDS` (it would never answer,
        and the wait would last ``async_timeout`` for nothing); returns since when it is seen stopped (``None``: it
        runs)."""
        what = "start" if step < 0 else f"return the batch of generation step {step}"
        if not self._process.is_alive():
            raise GeneratorError(
                f"The generator process died (exit code {self._process.exitcode}) before it could {what}. "
                f"{self._output_hint()}async_generator='inline' generates in the training process instead."
            )
        if process_state(self._process.pid) != "stopped":
            return None
        now = time.monotonic()
        if stopped_since is None or now - stopped_since < STOPPED_GRACE_SECONDS:
            return now if stopped_since is None else stopped_since
        pid = self._process.pid
        raise GeneratorError(
            f"The generator worker (pid {pid}) is stopped (SIGSTOP or SIGTSTP): it cannot {what}, and would be "
            f"waited for until async_timeout={self.timeout:g} s for nothing. Something stopped the worker alone "
            f"(kill -STOP {pid}, a tool that suspends processes): suspend and resume the whole job instead "
            "(the trainer and its worker together), and resume this run from its last checkpoint "
            "(train(resume_from_checkpoint=...)); the trainer kills the stopped worker when it closes it. "
            "async_generator='inline' generates in the training process instead."
        )

    def close(self) -> None:
        """Stop the worker (it finishes the job it is on; killed after 10 s, or at once while it starts or is
        stopped) and reap it."""
        if self._process is None:
            return
        if self._process.pid is not None:
            # a worker still starting reads no queue yet, a stopped one never will: killed at once (SIGKILL ends a
            # stopped process too)
            if self._ready and process_state(self._process.pid) not in ("stopped", "traced"):
                with contextlib.suppress(Exception):
                    self._jobs.put(None)
                self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        for channel in (self._jobs, self._results):
            with contextlib.suppress(Exception):
                channel.close()
                channel.cancel_join_thread()  # nobody reads what is left in it

    def _output_hint(self) -> str:
        return f"Its output, if it printed any, is in {self.log_path}; " if self.log_path else ""

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()


def generator_log(output_dir: str | None, process_index: int) -> str | None:
    """The worker's own output (warnings, a crash below Python) goes to a file of the output dir, one per process of
    the run; its Python errors reach the trainer as errors."""
    if not output_dir:
        return None
    with contextlib.suppress(OSError):
        os.makedirs(output_dir, exist_ok=True)
    return os.path.join(output_dir, f"generator_process_rank{process_index}.log")


@register_generator("process")
def start_process_generator(host: AsyncRolloutHost, model_swap: WeightTransport) -> Callable[[], GeneratorProcess]:
    """A :class:`GeneratorProcess` with its own copy of the model samples the next ``k`` batches with HF ``generate``
    while the trainer trains (the worker loads the weights it is sent, so ``model_swap`` is not used)."""
    args = host.args
    settings = sampling_settings(host)

    def start_generator() -> GeneratorProcess:
        log_path = generator_log(args.output_dir, host.accelerator.process_index)
        return GeneratorProcess(host.model, settings, args.async_timeout, log_path=log_path)

    return start_generator
