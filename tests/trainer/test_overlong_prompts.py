"""Overlong prompts are named by their index (a stream's by its position) and their longest part, never by a last
message that many prompts share."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import cpu_args, digit_fraction, make_prompts
from datasets import Dataset, IterableDataset

import trl_reasoning as tr
from trl_reasoning.trainer.prompt_lengths import ContextGuard, preview

#: The question every conversational prompt ends with: naming a prompt by it would not tell the prompts apart.
QUESTION = "5+5="


def _text(prompt) -> str:
    return "\n".join(m["content"] for m in prompt) if isinstance(prompt, list) else prompt


def _guard(drop: bool, max_completion_length: int = 20) -> ContextGuard:
    """A context of 120 tokens, 20 of them for the completion; one token per character of the rendered text."""
    return ContextGuard(
        limit=120,
        max_completion_length=max_completion_length,
        render=lambda prompts: [_text(p) for p in prompts],
        count_tokens=lambda prompts: [len(_text(p)) for p in prompts],
        decode=lambda ids: "",
        drop=drop,
    )


def _conversation(i: int, document: str) -> list[dict]:
    return [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": document},
        {"role": "user", "content": QUESTION},
    ]


def _rows(conversational: bool) -> list[dict]:
    """Eight short prompts; #5 carries a long document (the part that makes it overlong), ending with the question."""
    rows = []
    for i in range(8):
        document = f"Context {i}: " + ("the long report on quarterly tides " * 6 if i == 5 else "short")
        rows.append({"prompt": _conversation(i, document) if conversational else f"{document}\n{QUESTION}"})
    return rows


@pytest.mark.parametrize("conversational", [True, False], ids=["conversational", "plain"])
def test_a_map_style_prompt_is_named_by_its_index_and_its_longest_part(conversational):
    dataset = Dataset.from_list(_rows(conversational))
    with pytest.warns(UserWarning) as caught:
        kept = _guard(drop=True).without_overlong(dataset, "train_dataset")
    assert len(kept) == 7
    (message,) = [str(w.message) for w in caught]
    assert "#5 (" in message and "Context 5: the long report" in message
    if conversational:
        assert "user message 2 of 3" in message
    assert f"'{QUESTION}'" not in message  # not the last message, which every prompt shares

    with pytest.raises(ValueError, match=r"#5 \(\d+ tokens: .*Context 5: the long report"):
        _guard(drop=False).without_overlong(dataset, "train_dataset")


@pytest.mark.parametrize("conversational", [True, False], ids=["conversational", "plain"])
def test_a_streamed_prompt_is_named_by_its_position_in_the_stream(conversational):
    rows = _rows(conversational)
    stream = IterableDataset.from_generator(lambda: iter(rows))
    checked = _guard(drop=True).without_overlong(stream, "train_dataset")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = list(checked)
        again = list(checked)  # read again (another epoch): no second warning
    assert len(first) == len(again) == 7
    messages = [str(w.message) for w in caught if "streamed" in str(w.message)]
    assert len(messages) == 1, messages
    assert "row 5 of the streamed train_dataset" in messages[0] and "Context 5: the long report" in messages[0]
    assert "skipped (filter_overlong_prompts=True)" in messages[0]

    refused = _guard(drop=False).without_overlong(IterableDataset.from_generator(lambda: iter(rows)), "eval_dataset")
    with pytest.raises(ValueError, match=r"row 5 of the streamed eval_dataset \(\d+ tokens: .*Context 5: the long"):
        list(refused)


def test_two_overlong_prompts_with_the_same_text_in_a_stream_are_both_named():
    """Named by position, two identical overlong rows of a stream are two warnings (by text they were one)."""
    long = {"prompt": "x" * 200}
    rows = [{"prompt": "a"}, long, {"prompt": "b"}, long]
    checked = _guard(drop=True).without_overlong(IterableDataset.from_generator(lambda: iter(rows)), "train_dataset")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [row["prompt"] for row in checked] == ["a", "b"]
    named = [str(w.message) for w in caught if "streamed" in str(w.message)]
    assert [m.split(" of the streamed")[0] for m in named] == ["The prompt of row 1", "The prompt of row 3"]


def test_the_preview_keeps_the_start_and_end_of_a_long_part_on_one_line():
    text = "BEGIN " + "middle\n" * 50 + " END"
    shown = preview(text, width=60)
    assert shown.startswith("'BEGIN") and shown.endswith("END'") and "\\n" not in shown and len(shown) <= 62
    assert preview([{"role": "user", "content": "hi"}]) == "user message: 'hi'"
    multimodal = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}]
    assert preview(multimodal) == "user message: 'what is it?'"


#: What the error says when the completion alone fills the context (it said "at most -8 prompt tokens" and listed
#: every prompt of the dataset).
NO_ROOM = (
    r"max_completion_length=(128|120) leaves no room for a prompt: the model's context is max_position_embeddings=120 "
    r"tokens.*Set max_completion_length below 120"
)


@pytest.mark.parametrize("max_completion_length", [120, 128])
@pytest.mark.parametrize("drop", [True, False], ids=["drop", "refuse"])
def test_a_completion_that_fills_the_context_is_named_not_every_prompt(max_completion_length, drop):
    guard = _guard(drop=drop, max_completion_length=max_completion_length)
    rows = _rows(conversational=False)
    for dataset in (Dataset.from_list(rows), IterableDataset.from_generator(lambda: iter(rows))):
        with pytest.raises(ValueError, match=NO_ROOM) as raised:
            guard.without_overlong(dataset, "train_dataset")
        assert "#0" not in str(raised.value) and "-8" not in str(raised.value)  # no prompt list, no negative budget
    with pytest.raises(ValueError, match=NO_ROOM):  # at generation too (environments, images)
        guard.check_batch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))


def test_a_trainer_whose_completion_fills_the_model_s_context_says_so(tiny_model_path, tmp_path):
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), max_completion_length=600))  # the model: 512
    with pytest.raises(ValueError, match=r"max_completion_length=600 leaves no room .* max_position_embeddings=512"):
        tr.ReasoningTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
