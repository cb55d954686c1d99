"""``utils.cached_folders``: a cached folder is built once, moved into place whole, and reused only when complete."""

from __future__ import annotations

import pytest

from trl_reasoning.utils.cached_folders import CACHE_ENV_VAR, built_once, default_cache_dir


def _builder(calls: list, fail: bool = False):
    def build(staging):
        calls.append(staging)
        folder = staging / "out"
        folder.mkdir()
        if fail:
            raise RuntimeError("the build failed")
        (folder / "done").write_text("1")
        return folder

    return build


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_folder_is_built_once_then_reused_and_a_failed_build_leaves_nothing(tmp_path, exclusive):
    target, complete, calls = tmp_path / "cache" / "model", lambda folder: (folder / "done").is_file(), []
    with pytest.raises(RuntimeError, match="the build failed"):
        built_once(target, _builder(calls, fail=True), complete, exclusive=exclusive)
    assert not target.exists() and [p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")] == []
    assert built_once(target, _builder(calls), complete, exclusive=exclusive) == (target, False)
    assert built_once(target, _builder(calls), complete, exclusive=exclusive) == (target, True)
    assert len(calls) == 2 and (target / "done").read_text() == "1"
    assert built_once(target, _builder(calls), complete, use_cache=False, exclusive=exclusive) == (target, False)
    assert len(calls) == 3 and not calls[-1].exists()  # rebuilt, its staging folder removed


def test_the_cache_dir_is_the_environment_variable_s_or_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv(CACHE_ENV_VAR)
    assert default_cache_dir().parts[-2:] == (".cache", "trl-reasoning")
