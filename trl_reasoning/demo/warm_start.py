"""The demo's supervised warm start (TRL's ``SFTTrainer``), cached on disk so that a second run skips it.

The cache key is a hash of everything that determines the checkpoint: the task, the tiny model's shape, the SFT
settings and the versions of torch, transformers and TRL. The cache lives in ``$TRL_REASONING_CACHE`` (default
``~/.cache/trl-reasoning``), one folder per key, written atomically (a half-written folder is never reused).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..tasks.chain_sums import ChainSumTask
from ..tasks.digit_reversal import ReversalTask
from ..utils.cached_folders import built_once, default_cache_dir

#: Bumped when the warm start's recipe changes in a way the settings below do not capture.
WARM_START_FORMAT = 1


@dataclass(frozen=True)
class WarmStartSettings:
    """
    The tiny model's shape and the supervised warm start's settings.

    Parameters:
        hidden_size (`int`, *optional*, defaults to `64`):
            Hidden size of the tiny Qwen2.
        num_layers (`int`, *optional*, defaults to `2`):
            Number of transformer layers.
        max_steps (`int`, *optional*, defaults to `400`):
            SFT optimizer steps.
        batch_size (`int`, *optional*, defaults to `32`):
            SFT batch size.
        learning_rate (`float`, *optional*, defaults to `3e-3`):
            SFT peak learning rate (linear decay).
        seed (`int`, *optional*, defaults to `0`):
            Seed of the model's initialization and of SFT's data order.
    """

    hidden_size: int = 64
    num_layers: int = 2
    max_steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    seed: int = 0


def cache_key(task: ReversalTask | ChainSumTask, settings: WarmStartSettings) -> str:
    """A short hash of the task, the settings and the library versions."""
    import torch
    import transformers
    import trl

    payload = {
        "format": WARM_START_FORMAT,
        "task": task.to_dict(),
        "settings": asdict(settings),
        "versions": [torch.__version__, transformers.__version__, trl.__version__],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _train_warm_start(task: ReversalTask | ChainSumTask, settings: WarmStartSettings, staging: Path) -> Path:
    """Train the tiny model with SFT on the task's teacher rows under `staging`; return the saved model folder
    (model, tokenizer and a `warm_start.json` naming the task and settings)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from ..models.tiny import build_model, build_tokenizer, cpu_config_kwargs

    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=settings.seed
    )
    args = SFTConfig(
        **cpu_config_kwargs(),
        output_dir=str(staging / "run"),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        logging_steps=max(1, settings.max_steps // 4),
        seed=settings.seed,
        log_level="warning",
        dataset_num_proc=None,
    )
    dataset = Dataset.from_list(task.warm_start_rows(tokenizer))
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    result = trainer.train()
    print(f"warm start: {settings.max_steps} SFT steps, final training loss {result.training_loss:.3f}", flush=True)
    model_dir = staging / "model"
    trainer.model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "warm_start.json").write_text(
        json.dumps({"task": task.to_dict(), "settings": asdict(settings)}, indent=2) + "\n"
    )
    return model_dir


def warm_start(
    task: ReversalTask | ChainSumTask,
    settings: WarmStartSettings | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
) -> tuple[Path, bool]:
    """
    Return the folder of the warm-started tiny model for `task`, training it with `SFTTrainer` unless cached.

    Args:
        task ([`ReversalTask`] or [`ChainSumTask`]):
            The problems; the warm start imitates the task's sloppy teacher on the training split.
        settings ([`WarmStartSettings`], *optional*):
            Model shape and SFT settings; defaults to `WarmStartSettings()`.
        cache_dir (`str` or `Path`, *optional*):
            Root of the cache; defaults to [`default_cache_dir`].
        use_cache (`bool`, *optional*, defaults to `True`):
            Reuse a cached checkpoint if there is one. The new checkpoint is cached either way.

    Returns:
        `tuple[Path, bool]`: the model folder (loadable with `from_pretrained`, tokenizer included) and whether it
        came from the cache.
    """
    settings = settings or WarmStartSettings()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return built_once(
        root / f"warm-start-{cache_key(task, settings)}",
        lambda staging: _train_warm_start(task, settings, staging),
        lambda folder: (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file(),
        use_cache=use_cache,
    )
