"""Activation checkpointing under the installed transformers' names (trl_reasoning.utils.checkpointing)."""

from __future__ import annotations

from transformers import Qwen2Config, Qwen2ForCausalLM, TrainingArguments

from trl_reasoning.utils.checkpointing import (
    CHECKPOINTING_FIELD,
    activation_checkpointing_disabled,
    is_activation_checkpointing,
)


def _model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
    )
    return Qwen2ForCausalLM(config)


def test_checkpointing_is_off_inside_the_block_and_restored_after():
    model = _model()
    model.train()
    assert not is_activation_checkpointing(model)
    with activation_checkpointing_disabled(model):
        assert not is_activation_checkpointing(model)
    assert not is_activation_checkpointing(model)  # off before: stays off
    model.activation_checkpointing_enable({"use_reentrant": False})
    with activation_checkpointing_disabled(model, {"use_reentrant": False}):
        assert not is_activation_checkpointing(model)
    assert is_activation_checkpointing(model)


def test_the_config_field_is_the_installed_transformers_one():
    assert CHECKPOINTING_FIELD in TrainingArguments.__dataclass_fields__
