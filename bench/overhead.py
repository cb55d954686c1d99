"""Per-step overhead of every trl-reasoning trainer against its TRL counterpart, with a confidence interval on the
ratio: ``GRPOTrainer`` with the closest ``loss_type`` for every preset, and TRL's own ``RLOOTrainer`` for RLOO.

Time: both sides are built in this one process on the same saved model, batch (a deterministic ``rollout_func``; HF
``generate`` seeded alike on both sides against ``RLOOTrainer``, which has none), seed and settings, and train *at the
same time* in two threads that take strict turns: ours runs ``--block-steps`` optimizer steps (default 1) while TRL
waits, then TRL runs as many, and so on (``interleaved_session``). Every step of one side is thus paired with the
step of the other side next to it in time, and a drift of the machine hits both alike. A session is one fresh pair of
trainers; ``--sessions`` of them (who goes first alternates) with ``--steps`` measured steps each after ``--warmup``
dropped ones. Per step and side: wall time and process CPU time (``time.process_time``: all threads, and the waiting
side uses none). The ratio ours / TRL is the geometric mean of the paired per-step ratios, with a 95% two-stage
bootstrap interval (sessions, then steps within them).

Memory allocator: glibc hands every large freed block back to the kernel and page-faults it in again at the next
allocation. On a 2-core VM that is half of a tiny model's step time and most of its step-to-step noise (coefficient of
variation 22% → 2%). The script therefore re-executes itself with glibc's mmap and trim thresholds raised (freed
memory stays in the process, as it does in PyTorch's CUDA caching allocator) unless ``--system-malloc`` is given.

Memory: the peak resident memory during ``train()`` of one fresh process per side (``--memory``), with glibc's
default settings (with freed memory kept, the peak would also count heap fragmentation). Dynamic sampling is
off for DAPO and CISPO here: it does more work on purpose (see ``bench/dynamic_sampling.py``), and so is their
overlong shaping, which TRL lacks. Usage:

    python bench/overhead.py [--sessions 4] [--steps 40] [--block-steps 1] [--memory] [--system-malloc] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _common import measure_train, run_worker, trainer_classes, workload_trainer  # noqa: E402
from _results import record  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

#: glibc settings that keep freed memory in the process (see the module docstring); ``--system-malloc`` skips them.
CACHING_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(2**32),
    "MALLOC_TRIM_THRESHOLD_": str(2**36),
    "MALLOC_TOP_PAD_": str(2**30),
}
ALIKE = {"dynamic_sampling": False, "overlong_cache_length": None}
# row -> (our trainer, our overrides, TRL trainer, TRL overrides, rollout_func on both sides?)
PAIRS = {
    "DAPO": ("DAPO", ALIKE, "GRPO", {"loss_type": "dapo", "epsilon_high": 0.28}, True),
    "CISPO": (
        "CISPO",
        {**ALIKE, "cast_lm_head_to_fp32": False},
        "GRPO",
        {"loss_type": "cispo", "epsilon_high": 5.0},
        True,
    ),
    "DPPO": ("DPPO", {}, "GRPO", {"loss_type": "grpo"}, True),
    "MaxRL": ("MaxRL", {"maxrl_reward_threshold": 3.0}, "GRPO", {"loss_type": "dapo"}, True),
    "RLOO vs GRPOTrainer": ("RLOO", {}, "GRPO", {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.05}, True),
    "RLOO vs RLOOTrainer": ("RLOO", {}, "RLOO", {"beta": 0.05}, False),
    "DrGRPO": ("DrGRPO", {}, "GRPO", {"loss_type": "dr_grpo", "scale_rewards": "none"}, True),
    "ScaleRL": (
        "ScaleRL",
        {},
        "GRPO",
        {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch", "cast_lm_head_to_fp32": True},
        True,
    ),
}
#: The overhead goals: every preset within 3% of its TRL counterpart, RLOO no slower than TRL's RLOOTrainer. RLOO
#: against GRPOTrainer has none: it does one more forward on purpose (see the note under the table).
GOAL: dict[str, float | None] = {"RLOO vs RLOOTrainer": 1.0, "RLOO vs GRPOTrainer": None}
DEFAULT_GOAL = 1.03


def trainer_for(row: str, side: str, steps: int, vocab: int, length: int):
    """The trainer of one side (``"ours"`` or ``"trl"``) of ``row``, built on the shared workload."""
    ours, our_overrides, theirs, their_overrides, rollout = PAIRS[row]
    name, overrides = (ours, our_overrides) if side == "ours" else (f"trl.{theirs}", their_overrides)
    return workload_trainer(*trainer_classes(name), overrides, steps, vocab, length, rollout=rollout)


class Baton:
    """Strict turns between two training threads: the side holding the turn runs, the other waits. A side that has
    finished (or failed) gives its turns up for good, so the other never waits on it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._turn: str | None = None
        self._gone: set[str] = set()

    def wait(self, side: str) -> None:
        with self._condition:
            self._condition.wait_for(lambda: self._turn == side or bool(self._gone - {side}))

    def give(self, side: str) -> None:
        with self._condition:
            self._turn = side
            self._condition.notify_all()

    def leave(self, side: str) -> None:
        with self._condition:
            self._gone.add(side)
            self._condition.notify_all()


class TurnClock(TrainerCallback):
    """Times one side of an interleaved pair, step by step, and hands the turn to the other side every
    ``block_steps`` optimizer steps.

    A step's segment runs from the moment this side holds the turn (or ended its previous step) to the end of its
    optimizer step, so it holds everything the trainer does per step: logging the previous step, fetching the batch,
    generation and scoring, the loss, backward and the optimizer. The other side is blocked meanwhile, so the process
    CPU time of the segment is this side's alone. Before each turn the global torch RNG is seeded from the step, so
    both sides sample the same completions where they sample (TRL's ``RLOOTrainer`` row)."""

    def __init__(
        self,
        side: str,
        other: str,
        baton: Baton,
        ready: threading.Event,
        block_steps: int,
        seed: int,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        self.side, self.other, self.baton, self.ready = side, other, baton, ready
        self.block_steps, self.seed, self.synchronize = block_steps, seed, synchronize or (lambda: None)
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def _take_turn(self, step: int) -> None:
        self.baton.wait(self.side)
        torch.manual_seed(self.seed + step)
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def on_train_begin(self, args, state, control, **kwargs):
        self.ready.set()
        self._take_turn(0)

    def on_step_end(self, args, state, control, **kwargs):
        self.synchronize()
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)
        if state.global_step % self.block_steps == 0:
            self.baton.give(self.other)
            self._take_turn(state.global_step)
        else:
            self._wall, self._cpu = time.perf_counter(), time.process_time()


def interleaved_session(
    build: Callable[[str], object],
    first: str,
    block_steps: int = 1,
    seed: int = 0,
    synchronize: Callable[[], None] | None = None,
) -> dict[str, TurnClock]:
    """Train the trainers ``build("ours")`` and ``build("trl")`` at the same time, in strict turns of ``block_steps``
    steps starting with ``first``, each in its own thread; return each side's ``TurnClock``.

    Both trainers are built first, and each thread's ``train()`` set-up runs alone, before the first turn. An
    exception in either thread is raised here once both have stopped."""
    sides = ("ours", "trl") if first == "ours" else ("trl", "ours")
    trainers = {side: build(side) for side in sides}
    baton = Baton()
    ready = {side: threading.Event() for side in sides}
    clocks = {
        side: TurnClock(side, other, baton, ready[side], block_steps, seed, synchronize)
        for side, other in (sides, sides[::-1])
    }
    errors: dict[str, BaseException] = {}

    def train(side: str) -> None:
        try:
            trainers[side].add_callback(clocks[side])
            trainers[side].train()
        except BaseException as error:  # re-raised in the calling thread
            errors[side] = error
        finally:
            ready[side].set()
            baton.leave(side)

    threads = {side: threading.Thread(target=train, args=(side,), name=f"train-{side}") for side in sides}
    for side in sides:  # one set-up at a time: each thread runs until its on_train_begin
        threads[side].start()
        ready[side].wait()
    baton.give(first)
    for thread in threads.values():
        thread.join()
    for side, error in errors.items():
        raise RuntimeError(f"the {side!r} trainer failed in an interleaved session") from error
    return clocks


def ratio_interval(sessions: list[list[float]], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean ratio and its 95% interval from per-session lists of paired log-ratios
    ``log(ours_i / theirs_i)``: a two-stage percentile bootstrap (sessions with replacement, then the step pairs of
    each drawn session with replacement), so that both the step-to-step noise and any difference between fresh
    trainer pairs widen the interval."""
    rng = random.Random(seed)
    point = statistics.fmean(value for session in sessions for value in session)
    means = []
    for _ in range(resamples):
        drawn = [rng.choices(session, k=len(session)) for session in rng.choices(sessions, k=len(sessions))]
        means.append(statistics.fmean(value for session in drawn for value in session))
    means.sort()
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return math.exp(point), math.exp(low), math.exp(high)


def memory_worker(row: str, side: str, steps: int, vocab: int, length: int) -> dict:
    return measure_train(trainer_for(row, side, steps, vocab, length))


def verdict(row: str, ratio: tuple[float, float, float]) -> str:
    goal = GOAL.get(row, DEFAULT_GOAL)
    if goal is None:
        return "no goal (more work, see below)"
    if ratio[2] <= goal:
        return f"≤ {goal:.2f}: met (interval below)"
    if ratio[1] > goal:
        return f"> {goal:.2f}: missed (interval above)"
    return f"undecided at {goal:.2f}"


def measure_row(row: str, options) -> dict[str, list[list[float]]]:
    """Per session and side, the measured steps' wall and CPU seconds: ``{"wall": {"ours": [[...], ...], ...}}``."""
    result: dict = {"wall": {"ours": [], "trl": []}, "cpu": {"ours": [], "trl": []}}
    steps = options.warmup + options.steps
    for session in range(options.sessions):
        clocks = interleaved_session(
            lambda side: trainer_for(row, side, steps, options.vocab, options.length),
            first="ours" if session % 2 == 0 else "trl",
            block_steps=options.block_steps,
        )
        for side, clock in clocks.items():
            result["wall"][side].append(clock.wall[options.warmup :])
            result["cpu"][side].append(clock.cpu[options.warmup :])
    return result


def paired_logs(ours: list[list[float]], theirs: list[list[float]]) -> list[list[float]]:
    return [[math.log(a / b) for a, b in zip(x, y, strict=True)] for x, y in zip(ours, theirs, strict=True)]


def _parse_options(argv: list[str] | None) -> argparse.Namespace:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4, help="fresh trainer pairs per row")
    parser.add_argument("--steps", type=int, default=40, help="measured steps per side and session")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each session left out")
    parser.add_argument("--block-steps", type=int, default=1, help="steps per turn before the other side runs")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--length", type=int, default=64, help="completion length in tokens")
    parser.add_argument("--rows", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--memory", action="store_true", help="also peak memory, one fresh process per side")
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's default allocator settings")
    parser.add_argument("--quick", action="store_true", help="2 short sessions, small model, DAPO: checks it runs")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "SIDE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _table_header(options, malloc: str) -> list[str]:
    """The description of the measurement and the table's header rows."""
    return [
        f"Overhead vs TRL: Qwen2 2x128, vocab {options.vocab}, 8 completions x {options.length} tokens per step, one "
        f"process, {torch.get_num_threads()} torch thread(s), {malloc}. Per row: {options.sessions} sessions (a fresh "
        f"pair of trainers each) in which both sides train in turns of {options.block_steps} step(s), "
        f"{options.steps} measured steps per side and session after {options.warmup} left out. Ratio ours / TRL: "
        "geometric mean of the paired per-step ratios [95% two-stage bootstrap interval]; s/step: medians."
        + (
            " Peak MiB: resident memory during train() above the level before it, one fresh process per side with "
            "glibc's default settings."
            if options.memory
            else ""
        ),
        "",
        "| trainer | TRL counterpart | wall s/step ours | wall s/step TRL | wall ratio [95% CI] | CPU ratio [95% CI] "
        "| verdict (wall) |" + (" peak MiB ours | peak MiB TRL |" if options.memory else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if options.memory else ""),
    ]


def _row_line(row: str, options, system_malloc_env: dict) -> str:
    """One table row: the paired per-step ratios of ``row`` with their intervals (and peak memory with --memory)."""
    times = measure_row(row, options)
    wall = ratio_interval(paired_logs(times["wall"]["ours"], times["wall"]["trl"]))
    cpu = ratio_interval(paired_logs(times["cpu"]["ours"], times["cpu"]["trl"]))
    median = {side: statistics.median(t for session in times["wall"][side] for t in session) for side in times["wall"]}
    _, _, theirs, their_overrides, _ = PAIRS[row]
    counterpart = f"{theirs}Trainer " + ", ".join(f"{k}={v}" for k, v in their_overrides.items())
    line = (
        f"| {row.split(' vs ')[0]} | {counterpart} | {median['ours']:.4f} | {median['trl']:.4f} | "
        f"{wall[0]:.3f} [{wall[1]:.3f}, {wall[2]:.3f}] | {cpu[0]:.3f} [{cpu[1]:.3f}, {cpu[2]:.3f}] | "
        f"{verdict(row, wall)} |"
    )
    if options.memory:
        peaks = {
            side: run_worker(
                os.path.abspath(__file__),
                ["--worker", row, side, "--warmup", str(options.warmup), "--vocab", str(options.vocab)]
                + ["--length", str(options.length)],
                in_process=main if options.quick else None,
                env=system_malloc_env,
            )["peak_mib"]
            for side in ("ours", "trl")
        }
        line += f" {peaks['ours']:.0f} | {peaks['trl']:.0f} |"
    return line


def main(argv: list[str] | None = None) -> str:
    options = _parse_options(argv)
    if options.quick:
        options.sessions, options.steps, options.warmup, options.vocab, options.length = 2, 2, 1, 512, 16
        if options.rows == list(PAIRS):
            options.rows = ["DAPO"]
    if options.worker_out:
        result = memory_worker(*options.worker, options.warmup + 3, options.vocab, options.length)
        with open(options.worker_out, "w") as f:
            json.dump(result, f)
        return ""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from _common import cpu_threads

    cpu_threads()
    malloc = (
        "glibc malloc with freed memory kept in the process ("
        + ", ".join(f"{k}={v}" for k, v in CACHING_MALLOC.items())
        + ")"
        if all(os.environ.get(k) == v for k, v in CACHING_MALLOC.items())
        else "glibc malloc, default settings"
    )
    lines = _table_header(options, malloc)
    # Peak memory with glibc's own settings: with freed memory kept, the peak would also count heap fragmentation.
    system_malloc_env = {key: value for key, value in os.environ.items() if key not in CACHING_MALLOC}
    for row in options.rows:
        line = _row_line(row, options, system_malloc_env)
        lines.append(line)
        print(line, flush=True)
    lines += [
        "",
        "RLOO puts `beta` in the reward with `log pi_old - log pi_ref`, so it makes one no-grad forward for `log pi_old` "
        "that an on-policy GRPOTrainer skips; TRL's own RLOOTrainer makes the same forward (and generates with HF "
        "`generate` on both sides of its row: it takes no `rollout_func`).",
    ]
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("Overhead against TRL (v3: steps in turns, intervals)", table)
    return table


def _reexecute_with_caching_malloc() -> None:
    """glibc reads its malloc settings at process start: set them and start this script again (once)."""
    if "--system-malloc" in sys.argv or all(os.environ.get(k) == v for k, v in CACHING_MALLOC.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CACHING_MALLOC})


if __name__ == "__main__":
    _reexecute_with_caching_malloc()
    main()
