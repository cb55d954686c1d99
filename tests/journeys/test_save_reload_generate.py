"""Journey: train past checkpoints, save the model, reload it the way a user would (a fresh `from_pretrained`, or
PEFT's `AutoPeftModelForCausalLM` for an adapter), and generate text. The reloaded model must be the trained one (same
logits, same greedy completion as the trainer's model) and not the base model; a mid-run checkpoint loads too, and a
LoRA adapter merged into its base and saved again reloads as a plain model."""

from __future__ import annotations

import pytest
import torch
from conftest import make_prompts
from transformers import AutoModelForCausalLM

from journeys._helpers import MAX_STEPS, PRESETS, checkpoint_steps, journey_args, lora_config
from trl_reasoning.models.loading import load_tokenizer

PROMPT = [{"role": "user", "content": "3+4="}]


def _train(name, model_path, output_dir, lora: bool):
    trainer_cls, config_cls, reward = PRESETS[name]
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=reward,
        args=config_cls(**journey_args(output_dir, max_completion_length=8)),
        train_dataset=make_prompts(6),
        peft_config=lora_config() if lora else None,
    )
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    assert {2, 4} <= set(checkpoint_steps(output_dir))
    return trainer


def _inputs(tokenizer) -> dict:
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)


@torch.no_grad()
def _logits(model, inputs) -> torch.Tensor:
    model.eval()
    return model(**inputs).logits.float()


@torch.no_grad()
def _greedy(model, tokenizer, inputs) -> tuple[list[int], str]:
    model.eval()
    output = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new_tokens = output[0, inputs["input_ids"].shape[1] :].tolist()
    return new_tokens, tokenizer.decode(new_tokens, skip_special_tokens=True)


def _assert_is_trained_model(reloaded, trainer, tokenizer, base_path) -> str:
    """The reloaded model computes what the trainer's model computes, not what the base model computes; returns its
    greedy completion."""
    inputs = _inputs(tokenizer)
    expected = _logits(trainer.model, inputs)
    torch.testing.assert_close(_logits(reloaded, inputs), expected, rtol=1e-4, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(base_path)
    assert not torch.allclose(_logits(base, inputs), expected, rtol=1e-4, atol=1e-5), "the trained model is the base"
    tokens, text = _greedy(reloaded, tokenizer, inputs)
    assert tokens, "no token generated"
    assert (tokens, text) == _greedy(trainer.model, tokenizer, inputs)
    assert isinstance(text, str)
    return text


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("name", ["DAPO", "ScaleRL"])
def test_full_model_saved_reloaded_and_generates(name, tiny_model_path, tmp_path):
    trainer = _train(name, tiny_model_path, tmp_path / "run", lora=False)
    save_dir = tmp_path / "final"
    trainer.save_model(str(save_dir))
    tokenizer = load_tokenizer(save_dir)
    assert tokenizer.chat_template and tokenizer.pad_token == "<pad>"
    reloaded = AutoModelForCausalLM.from_pretrained(save_dir)
    assert reloaded.config.tie_word_embeddings
    assert reloaded.get_output_embeddings().weight.data_ptr() == reloaded.get_input_embeddings().weight.data_ptr()
    _assert_is_trained_model(reloaded, trainer, tokenizer, tiny_model_path)

    # A mid-run checkpoint is a loadable model too, and generates.
    checkpoint = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-4")
    checkpoint_tokenizer = load_tokenizer(tmp_path / "run" / "checkpoint-4")
    tokens, _ = _greedy(checkpoint, checkpoint_tokenizer, _inputs(checkpoint_tokenizer))
    assert tokens


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("name", ["DAPO", "ScaleRL"])
def test_lora_adapter_saved_reloaded_merged_and_generates(name, tiny_model_path, tmp_path):
    from peft import AutoPeftModelForCausalLM

    trainer = _train(name, tiny_model_path, tmp_path / "run", lora=True)
    save_dir = tmp_path / "adapter"
    trainer.save_model(str(save_dir))
    assert (save_dir / "adapter_model.safetensors").is_file() and (save_dir / "adapter_config.json").is_file()
    assert not (save_dir / "model.safetensors").exists(), "the whole model was saved instead of the adapter"
    tokenizer = load_tokenizer(save_dir)
    reloaded = AutoPeftModelForCausalLM.from_pretrained(save_dir)  # finds the base through adapter_config.json
    _assert_is_trained_model(reloaded, trainer, tokenizer, tiny_model_path)

    # Deploying: merge the adapter into the base, save, reload as a plain model.
    merged_dir = tmp_path / "merged"
    reloaded.merge_and_unload().save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    _assert_is_trained_model(merged, trainer, load_tokenizer(merged_dir), tiny_model_path)

    # The adapter of a mid-run checkpoint loads on the base model and generates.
    checkpoint = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-4")
    tokens, _ = _greedy(checkpoint, tokenizer, _inputs(tokenizer))
    assert tokens
