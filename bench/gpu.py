"""The overhead and DPPO top-K benches on a GPU: a randomly initialised ~0.5B-parameter Qwen2 (Qwen2.5-0.5B's shape)
in bf16, training throughput in tokens/s and model FLOPs utilisation (MFU) next to TRL's counterparts.

Same method as ``bench/overhead.py`` (both sides in one process, training in strict turns of one step, the ratio of
paired steps with a 95% two-stage bootstrap interval; the clocks wait for the GPU) and ``bench/dppo_topk.py`` (DPPO
top-K TV vs binary TV vs DAPO, peak CUDA memory). Completions come from the deterministic ``rollout_func`` of
``bench/_common.py``, so the step is the training work alone (the log-prob forwards, the loss, backward and the
optimizer). Tokens/s counts prompt + completion tokens trained per second; MFU is
``6 * parameters * tokens`` per second over the device's dense bf16 peak (``--peak-tflops``; H100/H200 SXM: 989),
the usual approximation that leaves attention's quadratic term out. Usage (needs CUDA):

    python bench/gpu.py [--sessions 3] [--steps 20] [--length 512] [--peak-tflops 989]
    python bench/gpu.py --smoke   # the same code on a CPU with a tiny model: checks the script runs, not a result

Three more tables (prepared for the next loan, sized to run in under 8 minutes with the defaults, so that a
15-minute loan has time for a rerun):

- **padding-free on ragged completions** (``--padding-free``): TRL's GRPO through ``ReasoningTrainer`` (packed) and
  ``GRPOTrainer`` (padded), completions replayed with ``bench/padding_free.py``'s log-normal lengths (mean
  ``--ragged-mean``, capped at ``--ragged-max``); tokens/s and MFU count the real tokens trained (TRL's logged
  ``num_tokens``), the same on both sides;
- **DPPO top-K's peak memory in bf16** (``--topk``): top-K TV against binary TV, both packed;
- **asynchronous rollouts with generation** (``--async``): HF ``generate`` samples (no ``rollout_func``), the
  generator process on the same GPU sampling the next batch while the trainer trains (``max_staleness=1``), against the
  same run synchronous; throughput in trained tokens per second.

It ran on one H200 on 2026-11-27 (bench/RESULTS.md, "GPU: overhead and DPPO top-K on a 0.5B Qwen2"); the three
tables above have not run on a GPU yet. Each row is printed as soon as it is measured, so a run stopped by a time limit
still shows what it measured; ``--rows``, ``--padding-free``, ``--topk`` and ``--async`` pick the rows (an empty list
skips a table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import trainer_classes, workload_trainer  # noqa: E402
from _results import record  # noqa: E402
from overhead import PAIRS, interleaved_session, paired_logs, ratio_interval  # noqa: E402
from padding_free import replay_rollout  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

#: Qwen2.5-0.5B's shape (494M parameters with tied embeddings).
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
SMOKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=True,
)
#: Dense bf16 peak TFLOP/s by device name fragment (vendor data sheets, SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
#: The overhead rows: bench/overhead.py's, and ScaleRL trained synchronously (its preset default is asynchronous
#: rollouts, which TRL's counterpart does not do), which tells the cost of the preset from the cost of the pipeline.
ROWS = {
    **PAIRS,
    "ScaleRL, synchronous": ("ScaleRL", {"async_rollouts": False}, *PAIRS["ScaleRL"][2:]),
}
#: The padding-free rows: bench/padding_free.py's length distributions (log-normal sigma; 0: equal lengths).
RAGGED = {"long-tailed": "long-tailed", "equal": "equal"}
#: The asynchronous rows with generation: (label, our overrides); TRL's synchronous step is the first row's baseline.
ASYNC_ROWS = {
    "synchronous": {"async_rollouts": False},
    "async, process generator, k = 1": {"async_rollouts": True, "async_generator": "process", "max_staleness": 1},
}
TOPK_CONFIGS = {
    "DPPO topk_tv": ("DPPO", {"dppo_divergence": "topk_tv"}),
    "DPPO binary_tv": ("DPPO", {"dppo_divergence": "binary_tv"}),
    "DAPO": ("DAPO", {"dynamic_sampling": False, "overlong_cache_length": None}),
}


def saved_model(shape: dict, smoke: bool) -> tuple[str, int]:
    """The randomly initialised model with the tiny character tokenizer, saved to a temporary folder; its path and
    parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_reasoning.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        **shape,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32" if smoke else "bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32 if smoke else torch.bfloat16)
    path = tempfile.mkdtemp(prefix="gpu-bench-model-")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def build(config_class, trainer_class, overrides: dict, model_path: str, options, steps: int, rollout: bool = True):
    """The shared workload (``_common.workload_trainer``) on the saved model, on the GPU in bf16 (CPU in smoke mode);
    ``rollout=False`` samples with HF ``generate`` instead of the workload's fixed ``rollout_func``."""
    device = {"use_cpu": True, "bf16": False} if options.smoke else {"bf16": True}
    device |= {"report_to": "none", "save_strategy": "no", "disable_tqdm": True, "gradient_checkpointing": False}
    overrides = {"per_device_train_batch_size": options.batch, "learning_rate": 1e-5, **overrides}
    vocab = 0  # unused: the model is the saved one at model_path
    return workload_trainer(
        config_class,
        trainer_class,
        overrides,
        steps,
        vocab,
        options.length,
        rollout=rollout,
        model_path=model_path,
        device_kwargs=device,
    )


class SyncedStepClock(TrainerCallback):
    """Each optimizer step's wall time, read after waiting for the GPU (CUDA work is asynchronous)."""

    def __init__(self) -> None:
        self.wall: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        _synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _synchronize()
        self.wall.append(time.perf_counter() - self._start)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tokens_per_step(trainer, options) -> int:
    """Prompt + completion tokens trained per step (the workload's prompts are ``q0`` ... ``q63``)."""
    prompt_tokens = max(1, len(trainer.processing_class("q10")["input_ids"]))
    return options.batch * (prompt_tokens + options.length)


def timed_run(classes, overrides, model_path, options) -> tuple[float, float, int]:
    """One trainer alone: median seconds per measured step, peak CUDA memory (MiB, 0 on a CPU) and the tokens trained
    per step."""
    import torch

    trainer = build(*classes, overrides, model_path, options, options.warmup + options.steps)
    clock = SyncedStepClock()
    trainer.add_callback(clock)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
    return statistics.median(clock.wall[options.warmup :]), peak, tokens_per_step(trainer, options)


def interleaved_times(sides: dict, model_path: str, options) -> tuple[dict[str, list[list[float]]], int]:
    """Per side, the measured steps' wall seconds of each session (both sides training in turns on the GPU), and the
    tokens trained per step."""
    times: dict[str, list[list[float]]] = {"ours": [], "trl": []}
    trainers = {}

    def make(side: str):
        classes, overrides = sides[side]
        trainers[side] = build(*classes, overrides, model_path, options, options.warmup + options.steps)
        return trainers[side]

    for session in range(options.sessions):
        clocks = interleaved_session(make, first="ours" if session % 2 == 0 else "trl", synchronize=_synchronize)
        for side, clock in clocks.items():
            times[side].append(clock.wall[options.warmup :])
    return times, tokens_per_step(trainers["ours"], options)


def peak_tflops(options) -> float:
    import torch

    if options.peak_tflops is not None:
        return options.peak_tflops
    if not torch.cuda.is_available():
        return 1.0  # smoke mode: a nominal peak, the MFU column is then meaningless
    name = torch.cuda.get_device_name(0)
    for fragment, value in PEAK_TFLOPS.items():
        if fragment in name:
            return value
    raise SystemExit(f"Unknown peak bf16 TFLOP/s for {name!r}: pass --peak-tflops.")


def overhead_row(row: str, model_path: str, parameters: int, peak: float, options, emit) -> None:
    """One overhead row: both sides trained in turns, their tokens/s, MFU and paired time ratio, passed to ``emit``."""
    ours, our_overrides, theirs, their_overrides, _ = ROWS[row]
    if theirs == "RLOO":  # TRL's RLOOTrainer takes no rollout_func: not a like-for-like training-only row
        return
    sides = {
        "ours": (trainer_classes(ours), our_overrides),
        "trl": (trainer_classes(f"trl.{theirs}"), their_overrides),
    }
    times, tokens = interleaved_times(sides, model_path, options)
    ratio = ratio_interval(paired_logs(times["ours"], times["trl"]))
    rate = {side: tokens / statistics.median(t for session in times[side] for t in session) for side in times}
    mfu = {side: 6 * parameters * rate[side] / peak for side in rate}
    counterpart = f"{theirs}Trainer {', '.join(f'{k}={v}' for k, v in their_overrides.items())}"
    emit(
        f"| {ours if row in PAIRS else row} | {counterpart} | {rate['ours']:.0f} | {rate['trl']:.0f} | "
        f"{mfu['ours']:.1%} | {mfu['trl']:.1%} | {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] |"
    )


def tokens_per_step_logged(trainer) -> float:
    """The real prompt + completion tokens trained per step: the median increase of TRL's logged ``num_tokens``."""
    totals = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry]
    return statistics.median(b - a for a, b in zip([0.0, *totals], totals))


def padding_free_row(distribution: str, model_path: str, parameters: int, peak: float, options, emit) -> None:
    """TRL's GRPO packed (ours) and padded (TRL's) on ragged replayed completions: tokens/s, MFU, time ratio."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sides = {"ours": (trainer_classes("Reasoning"), {}), "trl": (trainer_classes("trl.GRPO"), {})}
    trainers = {}

    def make(side: str):
        classes, overrides = sides[side]
        overrides = {**overrides, "max_completion_length": options.ragged_max}
        trainer = build(*classes, overrides, model_path, options, options.warmup + options.steps)
        trainer.rollout_func = replay_rollout(tokenizer, RAGGED[distribution], options.ragged_max, options.ragged_mean)
        trainers[side] = trainer
        return trainer

    times: dict[str, list[list[float]]] = {"ours": [], "trl": []}
    for session in range(options.sessions):
        clocks = interleaved_session(make, first="ours" if session % 2 == 0 else "trl", synchronize=_synchronize)
        for side, clock in clocks.items():
            times[side].append(clock.wall[options.warmup :])
    tokens = tokens_per_step_logged(trainers["ours"])
    ratio = ratio_interval(paired_logs(times["ours"], times["trl"]))
    rate = {side: tokens / statistics.median(t for s in times[side] for t in s) for side in times}
    mfu = {side: 6 * parameters * rate[side] / peak for side in rate}
    emit(
        f"| {distribution} | {tokens:.0f} | {rate['ours']:.0f} | {rate['trl']:.0f} | {mfu['ours']:.1%} | "
        f"{mfu['trl']:.1%} | {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] |"
    )


def async_row(label: str, model_path: str, parameters: int, peak: float, options, emit) -> None:
    """One arm of the asynchronous table: HF ``generate`` samples, the step's trained tokens per second and MFU."""
    overrides = {**ASYNC_ROWS[label], "max_completion_length": options.async_length}
    steps = options.warmup + options.steps
    # no rollout_func: generate samples the completions, as users train (and the process generator requires it)
    trainer = build(*trainer_classes("Reasoning"), overrides, model_path, options, steps, rollout=False)
    clock = SyncedStepClock()
    trainer.add_callback(clock)
    trainer.train()
    seconds = statistics.median(clock.wall[options.warmup :])
    tokens = tokens_per_step_logged(trainer)
    emit(f"| {label} | {seconds:.2f} | {tokens / seconds:.0f} | {6 * parameters * tokens / seconds / peak:.1%} |")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2, help="fresh trainer pairs per paired row")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per side and session")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each session left out")
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument("--length", type=int, default=512, help="completion length in tokens")
    parser.add_argument("--rows", nargs="*", default=["DAPO"], choices=list(ROWS), help="overhead rows")
    parser.add_argument("--padding-free", nargs="*", default=list(RAGGED), choices=list(RAGGED))
    parser.add_argument("--ragged-mean", type=int, default=400, help="padding-free rows: mean completion length")
    parser.add_argument("--ragged-max", type=int, default=2048, help="padding-free rows: max_completion_length")
    parser.add_argument("--async", dest="async_rows", nargs="*", default=list(ASYNC_ROWS), choices=list(ASYNC_ROWS))
    parser.add_argument("--async-length", type=int, default=256, help="asynchronous rows: max_completion_length")
    parser.add_argument(
        "--topk",
        nargs="*",
        default=list(TOPK_CONFIGS),
        choices=list(TOPK_CONFIGS),
        help="DPPO top-K rows (none: skip)",
    )
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak (default: by device name)")
    parser.add_argument("--smoke", action="store_true", help="tiny model on a CPU: checks the script runs")
    options = parser.parse_args(argv)
    import torch

    if options.smoke:
        options.sessions, options.steps, options.warmup, options.batch, options.length = 1, 2, 1, 8, 8
        options.rows = options.rows[:1]
        options.ragged_mean, options.ragged_max, options.async_length = 6, 16, 6
    elif not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA device; --smoke runs the same code on a CPU with a tiny model.")
    model_path, parameters = saved_model(SMOKE if options.smoke else QWEN2_05B, options.smoke)
    peak = peak_tflops(options) * 1e12
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke)"
    header = (
        f"{device}: random Qwen2 ({parameters / 1e6:.0f}M parameters, bf16 unless smoke), {options.batch} completions"
        f" x {options.length} tokens per step, rollout_func (no generation)."
    )
    lines: list[str] = []

    def emit(*new: str) -> None:
        # Each row is printed as soon as it is measured: a run cut short by a time limit still shows what it measured.
        lines.extend(new)
        print("\n".join(new), flush=True)

    emit(
        header,
        "",
        "| trainer | TRL counterpart | tokens/s ours | tokens/s TRL | MFU ours | MFU TRL | time ratio [95% CI] |",
        "|---|---|---|---|---|---|---|",
    )
    for row in options.rows:
        overhead_row(row, model_path, parameters, peak, options, emit)
    later_tables(model_path, parameters, peak, options, emit)
    table = "\n".join(lines)
    if not options.smoke:
        record("GPU: padding-free, DPPO top-K in bf16 and asynchronous generation on a 0.5B Qwen2", table)
    return table


def later_tables(model_path: str, parameters: int, peak: float, options, emit) -> None:
    """The padding-free, DPPO top-K and asynchronous tables, each row printed as it is measured."""
    if options.padding_free:
        emit(
            "",
            f"Padding-free: lengths log-normal, mean {options.ragged_mean}, capped at {options.ragged_max}; real tokens.",
            "",
            "| lengths | real tokens/step | tokens/s ours (packed) | tokens/s TRL (padded) | MFU ours | MFU TRL | "
            "time ratio [95% CI] |",
            "|---|---|---|---|---|---|---|",
        )
    for distribution in options.padding_free:
        padding_free_row(distribution, model_path, parameters, peak, options, emit)
    if options.topk:
        emit("", "| DPPO top-K (bf16, packed) | tokens/s | peak CUDA MiB |", "|---|---|---|")
    for name in options.topk:
        preset, overrides = TOPK_CONFIGS[name]
        seconds, memory, tokens = timed_run(trainer_classes(preset), overrides, model_path, options)
        emit(f"| {name} | {tokens / seconds:.0f} | {memory:.0f} |")
    if options.async_rows:
        emit(
            "",
            f"Generation with HF generate, at most {options.async_length} tokens; trained tokens per second.",
            "",
            "| rollouts | s/step | trained tokens/s | training MFU |",
            "|---|---|---|---|",
        )
    for label in options.async_rows:
        async_row(label, model_path, parameters, peak, options, emit)


if __name__ == "__main__":
    main()
