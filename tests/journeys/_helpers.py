"""Helpers shared by the journeys: the presets, LoRA/QLoRA settings, a realistic checkpoint cadence, snapshots.

Import as ``from journeys._helpers import ...`` (``tests/`` is on ``sys.path``: pytest puts the root of the
``journeys`` package there).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from conftest import PRESETS, cpu_args, lora_config, steps_per_rollout  # noqa: F401  (re-exported to the journeys)

#: The cadence of every journey: checkpoints at 2 and 4, and the run goes on to 5 (past each of them).
MAX_STEPS = 5
SAVE_STEPS = 2


def qlora_model_init_kwargs() -> dict:
    """`model_init_kwargs` that make TRL load the model (given as a path) in 4-bit NF4 on the CPU."""
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    return {"quantization_config": quantization, "device_map": {"": "cpu"}}


def journey_args(output_dir, **overrides) -> dict:
    """`cpu_args` with a real checkpoint cadence: save_strategy="steps", save_steps < max_steps."""
    kwargs = dict(save_strategy="steps", save_steps=SAVE_STEPS, max_steps=MAX_STEPS)
    kwargs.update(overrides)
    return cpu_args(output_dir=str(output_dir), **kwargs)


def rollout_args(config_cls: type, steps: int | None = None) -> dict:
    """Batch settings that keep a journey's rollout batch at 8 completions (2 prompts of `cpu_args`' 4 generations)
    when one rollout feeds several optimizer steps: ``steps`` (the preset's own by default, GSPO's 4) micro-batches of
    ``8 // steps`` completions. Nothing for a preset that samples every step."""
    steps = steps or steps_per_rollout(config_cls)
    return {} if steps == 1 else {"steps_per_generation": steps, "per_device_train_batch_size": 8 // steps}


def trainable_snapshot(model) -> dict[str, torch.Tensor]:
    snapshot = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    assert snapshot, "the model has no trainable parameter"
    return snapshot


def moved_parameters(model, snapshot: dict[str, torch.Tensor]) -> set[str]:
    """Names of the snapshot's parameters whose value changed."""
    current = dict(model.named_parameters())
    return {name for name, before in snapshot.items() if not torch.equal(current[name].detach(), before)}


def step_losses(trainer) -> dict[int, float]:
    """The logged training loss of every step, by step."""
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def assert_finite_losses(losses: dict[int, float], steps) -> None:
    assert sorted(losses) == list(steps), f"losses logged at steps {sorted(losses)}, expected {list(steps)}"
    assert all(math.isfinite(value) for value in losses.values()), losses


def checkpoint_steps(output_dir) -> list[int]:
    """The steps of the `checkpoint-N` folders in `output_dir`."""
    steps = []
    for path in Path(output_dir).iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def checkpoint_global_step(checkpoint) -> int:
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"]


def parameter_checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))
