"""Shared by the bench scripts: a deterministic workload (model, rollout, reward) and the measurements.

Every configuration trains on exactly the same batches: completions come from a deterministic ``rollout_func`` (a
hash of the prompt and of the completion's index), so differences in time and memory come from the trainers alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

# The two-process launcher and the sharding strategies live with the tests (``tests/_launch.py``,
# ``tests/_sharding.py``), which use them too: the suite never imports from bench/, and the benches import from tests/.
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from _launch import run_torchrun  # noqa: E402, F401  (re-exported to the bench scripts)


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


_SAVED_MODELS: dict[tuple[int, int, int], str] = {}


def trainer_classes(name: str) -> tuple[type, type]:
    """``(config class, trainer class)`` by name: a trl-reasoning preset (``"DAPO"``, ``"DrGRPO"``, ...), or TRL's own
    trainer with a ``trl.`` prefix (``"trl.GRPO"``, ``"trl.RLOO"``)."""
    import trl

    import trl_reasoning

    module, stem = (trl, name.removeprefix("trl.")) if name.startswith("trl.") else (trl_reasoning, name)
    return getattr(module, f"{stem}Config"), getattr(module, f"{stem}Trainer")


def preset_methods(
    labels: dict[str, str] | None = None, variants: dict[str, dict[str, tuple[str, dict]]] | None = None
) -> dict[str, tuple[str, dict]]:
    """Every preset of ``trl_reasoning.presets.PRESETS``, in its order, as ``label: (trainer name for
    trainer_classes, {})``, so a new preset is a method of the benches that list them. The label is the preset's
    display name (``"Dr. GRPO"``) unless ``labels`` renames it (by the preset's name, ``"dapo"``); ``variants`` adds
    rows of the same shape right after a preset (by its name)."""
    from trl_reasoning.presets import PRESETS

    methods: dict[str, tuple[str, dict]] = {}
    for preset in PRESETS:
        label = (labels or {}).get(preset.name, preset.display_name)
        methods[label] = (preset.config_class.__name__.removesuffix("Config"), {})
        methods.update((variants or {}).get(preset.name, {}))
    return methods


def saved_model(tokenizer, vocab: int, hidden: int = 128, layers: int = 2) -> str:
    """The tiny Qwen2 (``demo.tiny.build_model``, seed 0) with ``vocab`` tokens, saved with its tokenizer to a temporary
    folder; trainers load the policy and, when ``beta > 0``, the reference model from that path (TRL builds the
    reference from the model's ``name_or_path``)."""
    from trl_reasoning.models.tiny import build_model

    key = (vocab, hidden, layers)
    if key not in _SAVED_MODELS:  # once per process: later, with the process group up, only rank 0 would write
        path = tempfile.mkdtemp(prefix="bench-model-")
        build_model(tokenizer, hidden_size=hidden, num_layers=layers, vocab_size=vocab).save_pretrained(path)
        tokenizer.save_pretrained(path)
        _SAVED_MODELS[key] = path
    return _SAVED_MODELS[key]


def make_rollout(tokenizer, length: int):
    """A ``rollout_func`` returning, for each prompt, ``length`` token ids derived from a hash (no sampling)."""

    def rollout(prompts, trainer):
        prompt_ids, completion_ids = [], []
        for index, prompt in enumerate(prompts):
            digest = hashlib.sha256(f"{prompt[-1]['content']}|{index}".encode()).digest()
            completion_ids.append([digest[i % len(digest)] % len(tokenizer) for i in range(length)])
            rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(tokenizer.encode(rendered, add_special_tokens=False))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def hash_reward(completion_ids, **kwargs) -> list[float]:
    """A reward that differs between completions (so every group has a nonzero advantage)."""
    return [float(sum(ids) % 7) for ids in completion_ids]


def prompt_dataset(n: int = 64):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(n)])


def measure_train(trainer) -> dict:
    """Train, returning the peak resident memory above the level just before ``train()`` (MiB; Linux
    ``/proc/self/clear_refs`` resets the peak) and TRL's per-step ``step_time`` without the first (warm-up) step."""
    before = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    trainer.train()
    peak = rss_kib("VmHWM")
    times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry][1:]
    return {"peak_mib": (peak - before) / 1024, "step_times": times}


def workload_trainer(
    config_class,
    trainer_class,
    overrides: dict,
    steps: int,
    vocab: int,
    length: int,
    rollout: bool = True,
    model_path: str | None = None,
    device_kwargs: dict | None = None,
):
    """``trainer_class`` with ``config_class(device settings | common settings | overrides)`` on the shared workload
    (saved model, deterministic rollout, hash reward, 8 completions per process and step). ``rollout=False`` generates
    with HF ``generate`` instead (for trainers without ``rollout_func``, such as TRL's ``RLOOTrainer``): the same seed
    gives both sides of a comparison the same completions. ``model_path``: another saved model (with this workload's
    tokenizer) instead of the tiny one; ``device_kwargs``: the device settings, ``cpu_config_kwargs()`` by default."""
    from trl_reasoning.models.tiny import build_tokenizer, cpu_config_kwargs

    cpu_threads()
    tokenizer = build_tokenizer()
    # Saved before the config is built: under torchrun the config starts the distributed state, and each rank keeps
    # its own copy of the model folder.
    if model_path is None:
        model_path = saved_model(tokenizer, vocab)
    device_kwargs = cpu_config_kwargs() if device_kwargs is None else device_kwargs
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=length,
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        seed=0,
    )
    return trainer_class(
        model=model_path,
        reward_funcs=hash_reward,
        args=config_class(**{**device_kwargs, **common, **overrides}),
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
        **({"rollout_func": make_rollout(tokenizer, length)} if rollout else {}),
    )


def train_on_workload(config_class, trainer_class, overrides: dict, steps: int, vocab: int, length: int) -> dict:
    """Train ``workload_trainer(...)`` and return ``measure_train``'s result. Runs in a worker process."""
    return measure_train(workload_trainer(config_class, trainer_class, overrides, steps, vocab, length))


def run_worker(
    script: str,
    arguments: list[str],
    in_process: Callable[[list[str]], object] | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """Run ``script --worker-out OUT ...`` in a fresh process (clean memory accounting) and return its JSON result.

    ``in_process``: the script's ``main``, called here instead of starting a process. Quick modes use it (they check
    that a script runs, not its numbers): a process start costs ~10 s of imports on a 2-core machine. ``env``: the
    process's environment (this one's by default)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        if in_process is not None:
            in_process(["--worker-out", out, *arguments])
        else:
            command = [sys.executable, script, "--worker-out", out, *arguments]
            result = subprocess.run(command, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def cpu_threads() -> None:
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


def use_free_cores(requested: int | None = None) -> int:
    """Set torch's threads as the main job does (``trl_reasoning.utils.threads``: ``None`` = torch's default less the cores
    other processes keep busy now, ``0`` = torch's default) and return the count, for the table's header."""
    import torch

    from trl_reasoning.utils.threads import resolve_threads

    threads = resolve_threads(requested)
    torch.set_num_threads(threads)
    return threads


#: Two-sided 95% critical values of Student's t by degrees of freedom (used when scipy is not installed).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
_T95.update({11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093})
_T95.update({20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980})


def t_critical(df: int, confidence: float = 0.95) -> float:
    """Student's t quantile for a two-sided ``confidence`` interval with ``df`` degrees of freedom (scipy when
    installed; else a table at 95%, rounded toward the wider interval between its rows)."""
    try:
        from scipy import stats

        return float(stats.t.ppf(0.5 + confidence / 2, df))
    except ImportError:
        if confidence != 0.95:
            raise
        return _T95[min((d for d in _T95 if d >= df), default=120)] if df <= 120 else 1.96


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its two-sided Student-t interval (``nan`` bounds with fewer
    than two values). For paired differences (one per seed) this is the paired t interval."""
    import math
    import statistics

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_critical(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def geometric_t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(geometric mean, low, high)`` of positive ``values``: the t interval of their logs, mapped back. For ratios or
    scales (a step-time ratio, a fitted C_mid), where one large value would dominate a plain mean."""
    import math

    mean, low, high = t_interval([math.log(value) for value in values], confidence)
    return math.exp(mean), math.exp(low), math.exp(high)


def require_recorded_runs(found: int, runs_file: os.PathLike, wanted: list[str], recorded: list[str]) -> None:
    """Stop ``--summarize`` with a readable message when no recorded run matches the options, instead of a table
    built from nothing (and a results section overwritten with it). ``wanted`` and ``recorded`` are run keys."""
    if found:
        return
    shown = ", ".join(sorted(recorded)[:8]) or "none"
    raise SystemExit(
        f"no run recorded in {os.path.basename(runs_file)} matches these options (keys like {wanted[0]!r}); "
        f"recorded keys: {shown}{', ...' if len(recorded) > 8 else ''}. Pass the options the runs were made with "
        "(bench/RESULTS.md gives each table's command), or drop --summarize to run them."
    )
