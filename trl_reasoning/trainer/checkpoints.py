"""The trainer's own checkpoint file and what makes a checkpoint folder complete (files only, no TRL import).

Every checkpoint of a trl-reasoning trainer holds, next to the HF Trainer's files, ``trl_reasoning_sampling_state.json``:
the prompt-sampling state (ScaleRL's retired prompts, DAPO's extra-prompt stream, the sampler's epoch) that a resumed
run needs to go on as the uninterrupted one would. Three rules keep it as safe as the Trainer's own files:

- it is written atomically (a temporary file in the same folder, flushed, then ``os.replace``), so a kill or a full
  disk leaves the old file or none, never a truncated one;
- it is written before ``trainer_state.json``, which the Trainer writes last (only the hub push and the rotation of
  old checkpoints come after), so a folder whose ``trainer_state.json`` reads is complete;
- on load every problem names the file, says what is wrong and how to go on (:class:`SamplingStateError`).

``last_complete_checkpoint`` is what ``resume_from_checkpoint=True`` uses instead of the Trainer's
``get_last_checkpoint``, which takes the highest-numbered folder even when it was cut off mid-write.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

#: The file, in every checkpoint folder, that holds the sampling state.
SAMPLING_STATE_FILE = "trl_reasoning_sampling_state.json"
#: The keys every sampling-state file has.
SAMPLING_STATE_KEYS = ("retired_prompts", "prompt_stream", "sampler_epoch")

TRAINER_STATE_FILE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
#: Files or folders of which a checkpoint has at least one: the model (full, sharded, adapter), or the engine's own.
_WEIGHT_MARKERS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "pytorch_model_fsdp_0",  # FSDP sharded state dict
    "latest",  # DeepSpeed's pointer to its global_step folder
)


class SamplingStateError(ValueError):
    """A checkpoint's sampling-state file cannot be used; the message names the file, the problem and the way out."""


def write_json_atomically(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that a reader sees the old file (or none) or the whole new one: a
    temporary file in the same folder, flushed to disk, then renamed over ``path`` (``os.replace`` is atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(handle, 0o666 & ~umask)  # as an open() would make it (mkstemp's 0600 locks other users out)
        with os.fdopen(handle, "w") as file:
            json.dump(data, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _way_out(path: Path) -> str:
    return (
        f"Resume from an earlier checkpoint, or delete {path} to resume without it (retired prompts are then "
        "forgotten and the extra-prompt stream starts a new pass)."
    )


def read_sampling_state(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The sampling state saved in ``checkpoint``, checked for shape; ``None`` when the file is missing.

    Raises :class:`SamplingStateError` naming the file when it is empty, not JSON, or lacks the state's keys.
    """
    path = Path(checkpoint) / SAMPLING_STATE_FILE
    if not path.exists():
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SamplingStateError(
            f"{path} cannot be read ({type(error).__name__}: {error}). " + _way_out(path)
        ) from None
    if not text.strip():
        raise SamplingStateError(
            f"{path} is empty: the checkpoint's sampling state was cut off while it was written. " + _way_out(path)
        )
    try:
        state = json.loads(text)
    except json.JSONDecodeError as error:
        raise SamplingStateError(
            f"{path} is not valid JSON ({error}): the file is damaged. " + _way_out(path)
        ) from None
    if not isinstance(state, dict):
        raise SamplingStateError(
            f"{path} holds a {type(state).__name__}, not the sampling state's object. " + _way_out(path)
        )
    missing = [key for key in SAMPLING_STATE_KEYS if key not in state]
    if missing:
        raise SamplingStateError(f"{path} lacks {', '.join(missing)}: the file is damaged. " + _way_out(path))
    malformed = _malformed_entry(state)
    if malformed is not None:
        raise SamplingStateError(f"{path} has a malformed {malformed!r} entry. " + _way_out(path))
    return state


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _malformed_entry(state: dict[str, Any]) -> str | None:
    """The first entry of a sampling state whose shape is not what ``algorithms.prompt_sampling.PromptState`` writes (``None``: all are
    well formed), so that a damaged file is refused by name before any of it is loaded."""
    retired = state["retired_prompts"]
    if not (
        isinstance(retired, dict)
        and isinstance(retired.get("epoch_of"), dict)
        and all(_is_int(epoch) for epoch in retired["epoch_of"].values())
    ):
        return "retired_prompts"
    stream = state["prompt_stream"]
    if stream is not None:
        fields = ("passes", "position") if isinstance(stream, dict) and stream.get("streamed") else ("passes",)
        if not (isinstance(stream, dict) and all(_is_int(stream.get(field)) for field in fields)):
            return "prompt_stream"
        remaining = stream.get("remaining")
        if not stream.get("streamed") and not (isinstance(remaining, list) and all(map(_is_int, remaining))):
            return "prompt_stream"
    for key in ("sampler_epoch", "num_samples"):
        if state.get(key) is not None and not _is_int(state[key]):
            return key
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a complete checkpoint (``None`` when it is): no readable ``trainer_state.json`` (the
    Trainer writes it last), no model weights, a sampling-state file that cannot be read, or a safetensors file (the
    model's, an adapter's, the reference reset's) cut off."""
    folder = Path(folder)
    state_path = folder / TRAINER_STATE_FILE
    if not state_path.is_file():
        return f"it has no {TRAINER_STATE_FILE} (the save was cut off)"
    try:
        json.loads(state_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"its {TRAINER_STATE_FILE} is not valid JSON (the save was cut off)"
    if not any((folder / marker).exists() for marker in _WEIGHT_MARKERS):
        return "it has no model weights"
    try:
        read_sampling_state(folder)
    except SamplingStateError as error:
        return str(error).split(":")[0] + " cannot be read"
    damaged = damaged_weight_files(folder)
    if damaged:
        return f"{damaged[0]} is damaged ({damaged[1]})"
    return None


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """Why the safetensors file ``path`` is damaged, read from its header alone (no tensor is loaded): a header that
    does not parse, or a file shorter than the data its header describes (a copy or a save cut off). ``None``: whole."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length <= 0 or length > path.stat().st_size - 8:
                return "its header is cut off"
            header = json.loads(file.read(length))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        return f"its header does not read: {error}"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if path.stat().st_size < expected:
        return f"it holds {path.stat().st_size} bytes of the {expected} its header describes"
    return None


def damaged_weight_files(folder: str | os.PathLike) -> tuple[Path, str] | None:
    """The first damaged safetensors file of a checkpoint folder (its model, adapter or reference weights, in any
    sub-folder) and why, or ``None``."""
    for path in sorted(Path(folder).rglob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem is not None:
            return path, problem
    return None


def checkpoint_folders(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``output_dir``, newest (highest step) first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT_NAME.match(p.name))
    ]
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint of ``output_dir`` (``None`` if there is none) and the newer ones passed over,
    each with the reason (:func:`checkpoint_problem`)."""
    skipped = []
    for folder in checkpoint_folders(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder, skipped
        skipped.append((folder, problem))
    return None, skipped
