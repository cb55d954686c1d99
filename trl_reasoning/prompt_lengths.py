"""Prompts that cannot fit the model's context together with a completion (floor ½: tokenizer-level, no TRL import).

Past ``max_position_embeddings`` a model computes log-probabilities at positions it never saw (or fails outright, with
learned absolute positions), so such a prompt must not reach generation. TRL 1.16 lets transformers warn at generation
time; trl-reasoning finds them when the trainer is built and names each one.

Finding them is cheap: a prompt's token count is at most the number of bytes of its rendered text plus a few special
tokens (every token of a byte-level or byte-fallback vocabulary covers at least one byte, and a special token written
in the text is several bytes long), so only the prompts whose rendered text is long enough are tokenized.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Tokens a tokenizer may add around a text beyond its bytes (BOS, EOS and the like).
_SPECIAL_TOKEN_SLACK = 8


@dataclass(frozen=True)
class OverlongPrompt:
    """A prompt that does not fit: its ``index`` in the dataset (or in the stream), its ``tokens`` and a ``preview``
    of its text."""

    index: int
    tokens: int
    preview: str

    def describe(self) -> str:
        return f"#{self.index} ({self.tokens} tokens: {self.preview})"


def preview(prompt: Any, width: int = 60) -> str:
    """The start of a prompt's text (the last message's content for a conversation), for error messages."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    text = prompt if isinstance(prompt, str) else repr(prompt)
    text = text.replace("\n", " ")
    return repr(text[:width] + "..." if len(text) > width else text)


def find_overlong_prompts(
    prompts: Sequence[Any],
    budget: int,
    render: Callable[[list[Any]], list[str]],
    count_tokens: Callable[[list[Any]], list[int]],
    chunk_size: int = 512,
    first_index: int = 0,
) -> list[OverlongPrompt]:
    """The prompts whose token count exceeds ``budget`` (the context minus ``max_completion_length``).

    ``render(prompts)`` gives each prompt's text as the model will see it (chat template applied), ``count_tokens``
    the exact token counts; only prompts whose rendered text has more than ``budget - slack`` bytes are counted.
    """
    found = []
    for start in range(0, len(prompts), chunk_size):
        chunk = list(prompts[start : start + chunk_size])
        texts = render(chunk)
        candidates = [i for i, text in enumerate(texts) if len(text.encode("utf-8")) + _SPECIAL_TOKEN_SLACK > budget]
        if not candidates:
            continue
        counts = count_tokens([chunk[i] for i in candidates])
        found += [
            OverlongPrompt(first_index + start + i, count, preview(chunk[i]))
            for i, count in zip(candidates, counts, strict=True)
            if count > budget
        ]
    return found


def describe_overlong(found: Sequence[OverlongPrompt], limit: int = 5) -> str:
    """``"#3 (600 tokens: '7777...'), #9 (...) and 4 more"``."""
    shown = ", ".join(item.describe() for item in found[:limit])
    return shown + (f" and {len(found) - limit} more" if len(found) > limit else "")


class StreamedPromptCheck:
    """The same check for a streaming dataset, as its rows are read: a callable for ``IterableDataset.filter`` that
    drops a prompt longer than ``budget`` tokens with a warning naming it (its position in the stream), or raises a
    ``ValueError`` naming it when ``drop`` is off."""

    def __init__(self, budget: int, count_tokens: Callable[[list[Any]], list[int]], split: str, why: str, drop: bool):
        self.budget = budget
        self.count_tokens = count_tokens
        self.split = split
        self.why = why
        self.drop = drop
        self.position = 0
        self.dropped = 0

    def __call__(self, row: dict[str, Any]) -> bool:
        index, self.position = self.position, self.position + 1
        prompt = row.get("prompt")
        (tokens,) = self.count_tokens([prompt])
        if tokens <= self.budget:
            return True
        item = OverlongPrompt(index, tokens, preview(prompt))
        if not self.drop:
            raise ValueError(
                f"Prompt {item.describe()} of the streamed {self.split} {self.why}. Filter or shorten such prompts, "
                "lower max_completion_length, or set filter_overlong_prompts=True to skip them with a warning."
            )
        self.dropped += 1
        warnings.warn(
            f"Prompt {item.describe()} of the streamed {self.split} {self.why}: skipped (filter_overlong_prompts=True).",
            UserWarning,
            stacklevel=2,
        )
        return False
