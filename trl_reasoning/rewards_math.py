"""Math word problems with a numeric final answer (GSM8K): answer extraction, a 0/1 reward and prompt formatting.

The reward is binary, so it suits every preset (MaxRL included). Used by the GSM8K recipes and by
``trl-reasoning <algorithm> --task gsm8k``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

#: The system prompt of the GSM8K recipes: reason, then put the final number in \boxed{}.
GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem step by step. Put only the final numeric answer in \\boxed{}, e.g. \\boxed{42}."
)

_NUMBER = re.compile(r"-?\$?\s*\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*", re.IGNORECASE)


def normalize_number(text: str | None) -> str | None:
    """
    The canonical string of a number written as in GSM8K answers (`"1,234"`, `"$5"`, `"3.50"`, `"-2."`), or `None`
    if `text` holds no number. `"3.50"` and `"3.5"` normalize alike, as do `"4.0"` and `"4"`.
    """
    if text is None:
        return None
    match = _NUMBER.search(text)
    if match is None:
        return None
    raw = match.group(0).replace(",", "").replace("$", "").replace(" ", "")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    start, depth = starts[-1], 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_final_answer(text: str) -> str | None:
    """
    The normalized final number of a model's answer, looked for in this order: the last `\\boxed{...}`, the text after
    the last `####` (GSM8K's own marker), after the last "answer is"/"answer:", and finally the last number in the
    text. `None` when there is no number.
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return normalize_number(boxed)
    if "####" in text:
        return normalize_number(text.rsplit("####", 1)[1])
    matches = list(_ANSWER_IS.finditer(text))
    if matches:
        found = normalize_number(text[matches[-1].end() :])
        if found is not None:
            return found
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def extract_gsm8k_reference(answer: str) -> str:
    """The reference number of a GSM8K `answer` field (the text after `####`)."""
    if "####" not in answer:
        raise ValueError(f"A GSM8K answer ends with '#### <number>'; got {answer[-80:]!r}.")
    value = normalize_number(answer.rsplit("####", 1)[1])
    if value is None:
        raise ValueError(f"No number after '####' in the GSM8K answer {answer[-80:]!r}.")
    return value


def math_answer_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """
    1.0 when the completion's final number ([`extract_final_answer`]) equals the `answer` column (a number, or a
    full GSM8K solution ending in `#### <number>`), else 0.0.
    """
    rewards = []
    for completion, reference in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        expected = extract_gsm8k_reference(reference) if "####" in str(reference) else normalize_number(str(reference))
        predicted = extract_final_answer(text)
        rewards.append(float(predicted is not None and predicted == expected))
    return rewards


def format_gsm8k(example: dict[str, Any], system_prompt: str | None = GSM8K_SYSTEM_PROMPT) -> dict[str, Any]:
    """
    Map a GSM8K row (`question`, `answer`) to a conversational prompt and the reference number in `answer`, for
    `dataset.map(format_gsm8k)`.
    """
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": example["question"]})
    return {"prompt": messages, "answer": extract_gsm8k_reference(example["answer"])}
