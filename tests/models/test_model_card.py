"""The model card of a saved run: algorithm, non-default settings, the paper's BibTeX and the tags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cpu_args
from datasets import Dataset

from trl_reasoning import DAPOConfig, DAPOTrainer, GSPOConfig, MaxRLConfig
from trl_reasoning.models.loading import load_tokenizer
from trl_reasoning.models.model_card import (
    ReasoningModelCardMixin,
    non_default_settings,
    reasoning_card_section,
)
from trl_reasoning.models.tiny import cpu_config_kwargs
from trl_reasoning.tasks.digit_reversal import digit_reward


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_non_default_settings_compares_with_the_presets_field_defaults(tmp_path):
    args = DAPOConfig(**cpu_config_kwargs(output_dir=str(tmp_path)), epsilon_high=0.3, learning_rate=1e-4)
    changed = non_default_settings(args)
    assert changed["epsilon_high"] == (0.3, 0.28)  # DAPO's default is the preset's, not ReasoningConfig's None
    assert changed["learning_rate"] == (1e-4, DAPOConfig.__dataclass_fields__["learning_rate"].default)
    for name in ("policy_loss", "advantage_estimator", "loss_aggregation", "epsilon", "output_dir", "loss_type"):
        assert name not in changed
    # the same values are defaults for MaxRL's preset only where MaxRL's defaults say so
    maxrl = non_default_settings(
        MaxRLConfig(**cpu_config_kwargs(output_dir=str(tmp_path)), policy_loss="cispo", epsilon_high=5.0)
    )
    assert maxrl["policy_loss"] == ("cispo", "clip")
    with pytest.raises(TypeError, match="dataclass"):
        non_default_settings(object())


def test_a_batch_field_a_preset_sets_is_a_setting_and_one_trl_derives_is_not(tmp_path):
    """`steps_per_generation` is derived from the batch sizes, except in GSPO, whose 4 is the paper's four
    minibatches: a run that trains otherwise says so on its card."""
    kwargs = cpu_config_kwargs(output_dir=str(tmp_path))
    assert "steps_per_generation" not in non_default_settings(GSPOConfig(**kwargs))
    # four updates under accumulation are still the preset's (16 micro-batches derived from its 4), not a change
    accumulated = GSPOConfig(**kwargs, gradient_accumulation_steps=4)
    assert accumulated.steps_per_generation == 16
    assert "steps_per_generation" not in non_default_settings(accumulated)
    assert non_default_settings(GSPOConfig(**kwargs, steps_per_generation=1))["steps_per_generation"] == (1, 4)
    assert non_default_settings(GSPOConfig(**kwargs, generation_batch_size=16))["steps_per_generation"] == (2, 4)
    assert "steps_per_generation" not in non_default_settings(DAPOConfig(**kwargs, generation_batch_size=16))


def test_every_trainer_writes_the_reasoning_card():
    from trl_reasoning.trainer.base import ReasoningTrainer

    assert issubclass(ReasoningTrainer, ReasoningModelCardMixin)


def test_model_card_of_a_saved_folder(tiny_model_path, tmp_path):
    out = tmp_path / "dapo-run"
    args = DAPOConfig(
        **cpu_config_kwargs(output_dir=str(out)),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=5e-4,
        epsilon_high=0.3,
        dynamic_sampling=False,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(8)])
    trainer = DAPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(tiny_model_path),
    )
    trainer.train()
    trainer.save_model(str(out))
    trainer.create_model_card(model_name="dapo-run", dataset_name="toy/digits", tags=["my-tag"])

    text = (Path(out) / "README.md").read_text()
    meta = _front_matter(text)
    assert {"trl", "trl-reasoning", "dapo", "my-tag"} <= set(meta["tags"])
    assert meta["datasets"] == ["toy/digits"] or meta["datasets"] == "toy/digits"
    # the algorithm and its paper
    assert "## trl-reasoning" in text and "Trained with **DAPO**" in text
    assert "https://arxiv.org/abs/2503.14476" in text
    assert "advantage_estimator `grpo` · policy_loss `clip` · loss_aggregation `token_mean`" in text
    # the paper's BibTeX, as TRL prints the trainer's citation
    assert "@article{yu2025dapo," in text and "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" in text
    # the settings that differ from DAPOConfig's defaults, and not the ones that do not
    assert "| `epsilon_high` | `0.3` | `0.28` |" in text
    assert "| `learning_rate` | `0.0005` |" in text
    assert "| `dynamic_sampling` | `False` | `True` |" in text
    assert "`epsilon` |" not in text and "`output_dir`" not in text
    # TRL's card is kept around our section
    assert text.index("## trl-reasoning") < text.index("### Framework versions")
    assert "Cite TRL as:" in text and (Path(out) / "config.json").exists()


def test_card_section_without_paper_or_changes(tmp_path):
    class Bare:
        _name = "custom"
        args = DAPOConfig(**cpu_config_kwargs(output_dir=str(tmp_path)))

    section = reasoning_card_section(Bare())
    assert "Trained with **custom**" in section and "arxiv" not in section
    # only the CPU settings differ from the defaults
    assert "| `use_cpu` | `True` |" in section


def test_card_section_says_how_the_rollouts_were_sampled(tiny_model_path, tmp_path):
    """Read from a real trainer: the asynchronous run names its bound; a synchronous one says nothing of it."""
    prompts = Dataset.from_dict({"prompt": ["12", "345"] * 4})
    for async_rollouts, expected in ((True, "deterministic staleness bound of k = 3 generation steps"), (False, None)):
        output_dir = str(tmp_path / str(async_rollouts))
        args = DAPOConfig(
            **cpu_args(output_dir=output_dir, async_rollouts=async_rollouts, max_staleness=3, max_completion_length=8)
        )
        trainer = DAPOTrainer(model=tiny_model_path, reward_funcs=digit_reward, args=args, train_dataset=prompts)
        section = reasoning_card_section(trainer)
        if expected is None:
            assert "Rollouts:" not in section
        else:
            assert f"Rollouts: asynchronous, with a {expected}" in section


def test_push_to_hub_uploads_the_reasoning_card(tiny_model_path, tmp_path, monkeypatch):
    """`push_to_hub` works as in TRL (transformers' Trainer.push_to_hub), with the hub calls faked offline."""
    import transformers.trainer

    uploaded = {}

    class FakeApi:
        def create_repo(self, repo_name, **kwargs):
            uploaded["repo"] = repo_name
            return type("RepoUrl", (), {"repo_id": f"me/{Path(repo_name).name}"})()

        def upload_folder(self, repo_id, folder_path, **kwargs):
            uploaded.update(repo_id=repo_id, files=sorted(p.name for p in Path(folder_path).iterdir()))
            uploaded["card"] = (Path(folder_path) / "README.md").read_text()

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeApi())
    out = tmp_path / "pushed"
    args = MaxRLConfig(
        **cpu_config_kwargs(output_dir=str(out)),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        hub_model_id="pushed",
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(8)])
    from trl_reasoning import MaxRLTrainer
    from trl_reasoning.tasks.digit_reversal import all_digits

    trainer = MaxRLTrainer(
        model=tiny_model_path,
        reward_funcs=all_digits,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(tiny_model_path),
    )
    trainer.push_to_hub(dataset_name="toy/digits")
    assert uploaded["repo_id"] == "me/pushed" and "model.safetensors" in uploaded["files"]
    assert {"trl", "trl-reasoning", "maxrl"} <= set(_front_matter(uploaded["card"])["tags"])
    assert "Trained with **MaxRL**" in uploaded["card"] and "@article{tajwar2026maximum," in uploaded["card"]


def _card_of_a_model_from(folder: Path, output_dir: Path, **config) -> tuple[str, dict]:
    """The card a DAPO trainer writes (without training) for the model loaded from ``folder``."""
    args = DAPOConfig(
        **cpu_config_kwargs(output_dir=str(output_dir)),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        **config,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(4)])
    trainer = DAPOTrainer(
        model=str(folder),
        reward_funcs=digit_reward,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(str(folder)),
    )
    trainer.create_model_card(model_name=output_dir.name)
    text = (output_dir / "README.md").read_text()
    return text, _front_matter(text)


def test_card_names_a_local_base_folder_and_loads_the_output(tmp_path):
    """TRL writes "a fine-tuned version of [None]" and a quick start loading model="None" for a model loaded from a
    local folder: the card names the folder instead (not as a Hub link) and the quick start loads the output."""
    from trl_reasoning.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "my-local-base", seed=0)
    out = tmp_path / "run-out"
    text, meta = _card_of_a_model_from(base, out)
    assert "a fine-tuned version of `my-local-base` (a local folder)" in text
    assert "None" not in text.split("## Training procedure")[0]
    assert f'pipeline("text-generation", model="{out}"' in text
    assert meta.get("base_model") is None  # no Hub model of that name is known: no metadata pointing at one


def test_card_names_the_hub_model_a_converted_folder_records(tmp_path):
    """A folder converted by trl_reasoning.models.pretrained records its Hub name in its marker (transformers
    replaces config._name_or_path with the folder it loads): the card links it, in the text and the metadata; a
    hub_model_id is what the quick start loads."""
    import json

    from trl_reasoning.models.pretrained import MARKER_FILE
    from trl_reasoning.models.tiny import save_tiny_model

    base = save_tiny_model(tmp_path / "SmolLM2-135M-Instruct", seed=0)
    (base / MARKER_FILE).write_text(json.dumps({"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    text, meta = _card_of_a_model_from(base, tmp_path / "out", hub_model_id="me/smollm2-dapo")
    link = "[HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)"
    assert f"a fine-tuned version of {link}" in text
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert 'pipeline("text-generation", model="me/smollm2-dapo"' in text


def test_recorded_base_model_reads_the_marker_or_the_known_source(tmp_path):
    """The converted SmolLM2 folder knows its Hub name: from its marker, or (converted before the marker recorded
    it) from the source's SHA-256; a folder without a marker, or from an unknown source, has none."""
    import json

    from trl_reasoning.models.pretrained import MARKER_FILE, SMOLLM2, recorded_base_model

    assert recorded_base_model(tmp_path) is None
    (tmp_path / MARKER_FILE).write_text(json.dumps({"source_sha256": SMOLLM2.sha256, "files": {}}))
    assert recorded_base_model(tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / MARKER_FILE).write_text(json.dumps({"source_sha256": "0" * 64}))
    assert recorded_base_model(tmp_path) is None
    (tmp_path / MARKER_FILE).write_text(json.dumps({"source_sha256": "0" * 64, "base_model": "org/other"}))
    assert recorded_base_model(tmp_path) == "org/other"
