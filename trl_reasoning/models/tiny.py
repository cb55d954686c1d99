"""A tiny causal LM and a character-level tokenizer built from configs, fully offline (no hub).

Used by the demo and the tests. The tokenizer has one token per printable ASCII character plus ``<pad>``,
``<eos>`` and ``<unk>``, left padding, and a minimal chat template, so TRL treats it like any chat model.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..utils.checkpointing import CHECKPOINTING_FIELD

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'][0] }}:{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer (vocabulary of 101 tokens) with pad/eos tokens and a chat template."""
    characters = list(string.printable[:95]) + ["\n"]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + characters)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    vocab_size: int | None = None,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized for CPU tests (about 0.1M parameters by default). ``vocab_size``
    defaults to the tokenizer's; a larger one gives a model whose logits cost what a real LLM's do (benchmarks)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(path: str | Path, seed: int = 0, **model_kwargs) -> Path:
    """Build the tiny model and tokenizer and save both to ``path`` (loadable with ``from_pretrained``)."""
    path = Path(path)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cpu_config_kwargs(**overrides) -> dict:
    """Config arguments that make a TRL/trl-reasoning config train a tiny model on a CPU: fp32, no activation
    checkpointing (TRL turns it on by default), no reporting, no checkpoints, no progress bar.

    Checkpointing is set under the installed transformers' name (``activation_checkpointing``; the old
    ``gradient_checkpointing`` warns). To turn it on, pass either name through ``overrides``: next to these
    arguments, ``gradient_checkpointing=True`` would lose to ``activation_checkpointing=False``."""
    kwargs = dict(
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    # Off under the installed transformers' name (the old one warns); a caller's own setting, under either, wins.
    if not {"activation_checkpointing", "gradient_checkpointing"} & set(overrides):
        kwargs[CHECKPOINTING_FIELD] = False
    kwargs.update(overrides)
    return kwargs
