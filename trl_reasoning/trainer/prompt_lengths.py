"""Prompts that cannot fit the model's context together with a completion (tokenizer-level, no TRL import).

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

from ..utils.user_warnings import user_stacklevel

#: Tokens a tokenizer may add around a text beyond its bytes (BOS, EOS and the like).
_SPECIAL_TOKEN_SLACK = 8


@dataclass(frozen=True)
class OverlongPrompt:
    """A prompt that does not fit: its ``index`` in the dataset, its ``tokens`` and a ``preview`` of its longest
    part."""

    index: int
    tokens: int
    preview: str

    def describe(self) -> str:
        return f"#{self.index} ({self.tokens} tokens: {self.preview})"


def _message_text(content: Any) -> str:
    """A message's text: its content, or the text parts of a list of typed content blocks (multimodal messages)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [block.get("text") for block in content if isinstance(block, dict)]
        return " ".join(part for part in parts if isinstance(part, str))
    return "" if content is None else repr(content)


def _shorten(text: str, width: int) -> str:
    """``text`` on one line, its start and end kept when it is longer than ``width`` characters, quoted."""
    text = " ".join(text.split())
    if len(text) <= width:
        return repr(text)
    tail = width // 3
    return repr(f"{text[: width - tail - 3]}...{text[-tail:]}")


def preview(prompt: Any, width: int = 60) -> str:
    """A prompt's longest part, for error messages: a plain prompt's text, or a conversation's longest message (its
    role, its place among the messages and its text), shortened to ``width`` characters (start and end kept).

    The longest part is what makes a prompt overlong and what tells it apart, where the last message of a
    conversation is often a question its prompts share."""
    if isinstance(prompt, list) and prompt and all(isinstance(message, dict) for message in prompt):
        texts = [_message_text(message.get("content")) for message in prompt]
        longest = max(range(len(texts)), key=lambda i: len(texts[i]))
        role = prompt[longest].get("role", "message")
        where = f"{role} message {longest + 1} of {len(prompt)}" if len(prompt) > 1 else f"{role} message"
        return f"{where}: {_shorten(texts[longest], width)}"
    return _shorten(prompt if isinstance(prompt, str) else repr(prompt), width)


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
    """The same check for a streaming dataset, as its rows are read: a callable for ``IterableDataset.filter(...,
    with_indices=True)`` that drops a prompt longer than ``budget`` tokens with a warning naming it by its position in
    the stream and its longest part (once, however often the stream is read again: every epoch and dynamic sampling's
    extra prompts re-read it), or raises a ``ValueError`` naming it when ``drop`` is off."""

    def __init__(self, budget: int, count_tokens: Callable[[list[Any]], list[int]], split: str, why: str, drop: bool):
        self.budget = budget
        self.count_tokens = count_tokens
        self.split = split
        self.why = why
        self.drop = drop
        self.dropped: set[int] = set()  # the positions in the stream of the prompts skipped so far

    def __call__(self, row: dict[str, Any], position: int) -> bool:
        prompt = row.get("prompt")
        (tokens,) = self.count_tokens([prompt])
        if tokens <= self.budget:
            return True
        described = f"row {position} of the streamed {self.split} ({tokens} tokens: {preview(prompt)})"
        if not self.drop:
            raise ValueError(
                f"The prompt of {described} {self.why}. Filter or shorten such prompts, lower max_completion_length, "
                "or set filter_overlong_prompts=True to skip them with a warning."
            )
        if position not in self.dropped:
            self.dropped.add(position)
            warnings.warn(
                f"The prompt of {described} {self.why}: skipped (filter_overlong_prompts=True).",
                UserWarning,
                stacklevel=2,
            )
        return False


class ContextGuard:
    """Prompt + completion must fit the model's context (``limit = max_position_embeddings``): past it, positions the
    model never saw make every log-probability meaningless, and TRL 1.16 only lets transformers warn.

    :meth:`without_overlong` removes the prompts of a dataset that cannot fit with ``max_completion_length`` tokens,
    with a warning naming each (``drop=True``, ``filter_overlong_prompts``), or refuses them by name; a streaming
    dataset gets a filter that does the same as it is read. :meth:`check_batch` catches at generation time what that
    cannot see (image tokens, an environment's text). ``render(prompts)`` gives the prompts' text as generation sees
    it, ``count_tokens(prompts)`` their exact token counts, ``decode(ids)`` a preview's text.
    """

    def __init__(
        self,
        limit: int | None,
        max_completion_length: int,
        render: Callable[[list[Any]], list[str]],
        count_tokens: Callable[[list[Any]], list[int]],
        decode: Callable[[list[int]], str],
        drop: bool,
    ):
        self.limit = limit
        self.max_completion_length = max_completion_length
        self.render = render
        self.count_tokens = count_tokens
        self.decode = decode
        self.drop = drop

    def check_room(self) -> None:
        """A ``ValueError`` when ``max_completion_length`` alone fills the context: then no prompt can fit, and naming
        each prompt against a budget of ``limit - max_completion_length <= 0`` prompt tokens would say nothing."""
        if self.limit is not None and self.max_completion_length >= self.limit:
            raise ValueError(
                f"max_completion_length={self.max_completion_length} leaves no room for a prompt: the model's context "
                f"is max_position_embeddings={self.limit} tokens, and a prompt and its completion must fit in it "
                f"together. Set max_completion_length below {self.limit} (by at least your longest prompt's length), "
                "or train a model with a longer context."
            )

    def without_overlong(self, dataset, split: str):
        """``dataset`` without the prompts that cannot fit (``split`` names it in messages)."""
        from datasets import IterableDataset

        columns = getattr(dataset, "column_names", None)
        streamed = isinstance(dataset, IterableDataset)
        if self.limit is None or dataset is None or (columns is None and not streamed):
            return dataset  # (a stream from a generator knows its columns only once read)
        self.check_room()
        if columns is not None and "prompt" not in columns:
            return dataset
        budget = self.limit - self.max_completion_length
        why = (
            f"do not fit the model's context (max_position_embeddings={self.limit}) with max_completion_length="
            f"{self.max_completion_length} (at most {budget} prompt tokens)"
        )
        if streamed:
            return dataset.filter(
                StreamedPromptCheck(budget, self.count_tokens, split, why, self.drop), with_indices=True
            )
        found = find_overlong_prompts(dataset["prompt"], budget, self.render, self.count_tokens)
        if not found:
            return dataset
        if not self.drop:
            raise ValueError(
                f"{len(found)} prompts of the {split} {why}: {describe_overlong(found)}. Filter or shorten them (e.g. "
                "dataset.filter(...)), lower max_completion_length, or set filter_overlong_prompts=True to drop them "
                "with a warning."
            )
        if len(found) == len(dataset):
            raise ValueError(f"Every prompt of the {split} ({len(found)}) {why}: {describe_overlong(found)}.")
        warnings.warn(
            f"{len(found)} of the {len(dataset)} prompts of the {split} {why} and were removed (filter_overlong_prompts"
            f"=True): {describe_overlong(found)}.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        dropped = {item.index for item in found}
        return dataset.select([i for i in range(len(dataset)) if i not in dropped])

    def check_batch(self, prompt_ids, prompt_mask) -> None:
        """A ``ValueError`` naming the longest prompt of a generation batch (left-padded ``prompt_ids`` and their
        ``prompt_mask``, as TRL lays them out) when it cannot fit with ``max_completion_length`` tokens."""
        self.check_room()
        lengths = prompt_mask.sum(dim=1)
        longest_prompt = int(lengths.max().item()) if lengths.numel() else 0
        if self.limit is not None and longest_prompt + self.max_completion_length > self.limit:
            row = int(lengths.argmax())
            text = self.decode(prompt_ids[row][prompt_mask[row].bool()][-60:].tolist())
            raise ValueError(
                f"A prompt of {longest_prompt} tokens (ending {text!r}) plus max_completion_length="
                f"{self.max_completion_length} exceeds the model's context (max_position_embeddings={self.limit}). "
                "Filter or truncate long prompts in the dataset, or lower max_completion_length."
            )


def render_prompts(
    processing_class, prompts: list, tools=None, chat_template=None, **chat_template_kwargs
) -> list[str]:
    """Each prompt's text as generation sees it: the chat template applied to conversations as TRL's
    ``_tokenize_prompts`` applies it, plain prompts as they are."""
    if not (prompts and isinstance(prompts[0], list)):
        return [str(prompt) for prompt in prompts]
    return processing_class.apply_chat_template(
        conversation=prompts,
        tools=tools or None,
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=False,
        **chat_template_kwargs,
    )
