"""Shared fixtures: a tiny offline Qwen2 model + character tokenizer, a toy prompt dataset, CPU training args."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from trl_reasoning.demo.tiny import save_tiny_model  # noqa: E402


def cpu_args(**overrides) -> dict:
    """Keyword arguments that make a TRL/trl-reasoning config run fast and deterministically on a CPU."""
    args = dict(
        output_dir=overrides.pop("output_dir", "/tmp/trl-reasoning-tests"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        gradient_checkpointing=False,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    args.update(overrides)
    return args


def make_prompts(n: int = 16) -> Dataset:
    """Conversational prompts of varied lengths."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i * 7 % 10}="}]} for i in range(n)])


def digit_fraction(completions, **kwargs) -> list[float]:
    """A dense reward in [0, 1]: the fraction of the completion's characters that are digits."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def has_digit(completions, **kwargs) -> list[float]:
    """A binary reward: 1 if the completion contains a digit (about half of a random tiny model's completions)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in t)) for t in texts]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0))


@pytest.fixture(scope="session")
def tiny_untied_model_path(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-untied"), seed=0, tie_word_embeddings=False))


@pytest.fixture
def prompts() -> Dataset:
    return make_prompts()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
