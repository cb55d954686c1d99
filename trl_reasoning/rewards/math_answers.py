"""Math problems with a final answer (GSM8K and the like): answer extraction, a 0/1 reward and prompt formatting.

The reward is binary, so it suits every preset (MaxRL included). Used by the GSM8K recipes and by
``trl-reasoning <algorithm> --task gsm8k``. Plain numbers (``42``, ``1,234``, ``$3.50``) are compared here, exactly
and fast; anything else (``\frac{1}{2}``, ``10^3``, ``\boxed{3, 4}``) goes to ``math-verify``, the grader behind
TRL's ``accuracy_reward`` (``pip install "trl-reasoning[math]"``); without it such an answer counts as wrong, with a
warning. ``bench/math_reward.py`` measures both paths on a fixed set of completions.
"""

from __future__ import annotations

import importlib.util
import re
import threading
import warnings
from decimal import Decimal, InvalidOperation
from typing import Any

from ..utils.user_warnings import user_stacklevel

#: The system prompt of the GSM8K recipes: reason, then put the final number in \boxed{}.
GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem step by step. Put only the final numeric answer in \\boxed{}, e.g. \\boxed{42}."
)

# Commas only as thousands separators ("1,234"), so "3,4" is two numbers, not 34.
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER = re.compile(rf"-?\$?\s*(?:{_DIGITS})")
# A whole answer that is one number: an optional sign and dollar, the number, an optional trailing unit word or
# period ("$18", "18 dollars", "-2.5.", "1,000").
_PLAIN_NUMBER = re.compile(rf"-?\s*\$?\s*(?:{_DIGITS})(?:\s+[A-Za-z]+)?\s*\.?")
# LaTeX around a plain number that does not change it: \$, \text{...} / \mathrm{...} units, thin spaces.
_LATEX_DECORATION = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}|\\[,!;: ]|\\(?=\$)|~")
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


def _answer_span(text: str) -> tuple[str | None, bool]:
    """The part of ``text`` that holds the final answer, and whether it is the content of a ``\\boxed{}`` (a boxed
    answer is graded whole; the other markers are followed by prose, so only their first number counts)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed, True
    if "####" in text:
        return text.rsplit("####", 1)[1], False
    matches = list(_ANSWER_IS.finditer(text))
    if matches and _NUMBER.search(text[matches[-1].end() :]):
        return text[matches[-1].end() :], False
    numbers = _NUMBER.findall(text)
    return (numbers[-1], False) if numbers else (None, False)


def plain_number(answer: str) -> str | None:
    """
    The normalized number when all of `answer` is one plain number (`"42"`, `"1,234"`, `"\\$3.50"`,
    `"18 \\text{dollars}"`, `"-2."`), else `None`: `"3, 4"`, `"\\frac{1}{2}"` and `"10^3"` are not plain.
    """
    undecorated = _LATEX_DECORATION.sub(lambda m: f" {m.group(1)}" if m.group(1) is not None else "", answer).strip()
    return normalize_number(undecorated) if _PLAIN_NUMBER.fullmatch(undecorated) else None


def extract_final_answer(text: str) -> str | None:
    """
    The normalized final number of a model's answer, looked for in this order: the last `\\boxed{...}` (which must
    hold one plain number: `\\boxed{3, 4}` gives `None`), the text after the last `####` (GSM8K's own marker),
    after the last "answer is"/"answer:", and finally the last number in the text. `None` when there is none.
    """
    return _span_number(*_answer_span(text))


def _span_number(span: str | None, boxed: bool) -> str | None:
    """The normalized number of an answer span: a boxed one must be a plain number, the others give their first."""
    if span is None:
        return None
    return plain_number(span) if boxed else normalize_number(span)


def math_verify_available() -> bool:
    """Whether `math-verify` (the `math` extra) is installed."""
    return importlib.util.find_spec("math_verify") is not None


def _math_verify_equal(reference: str, text: str, boxed_answer: str | None) -> bool:
    """math-verify's verdict on the boxed answer when there is one, else on its own extraction from ``text``."""
    from math_verify import parse, verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set (TRL's accuracy_reward does the same).
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${reference}$", parsing_timeout=timeout)
    predicted = parse(f"$\\boxed{{{boxed_answer}}}$" if boxed_answer is not None else text, parsing_timeout=timeout)
    return bool(gold and predicted and verify(gold, predicted, timeout_seconds=timeout))


def grade_answer(text: str, reference: str, use_math_verify: bool | None = None) -> float:
    """
    1.0 when the completion `text` answers `reference` (a number or a LaTeX expression), else 0.0.

    Plain numbers on both sides are compared here as decimals. Otherwise (`\\boxed{\\frac{1}{2}}`, a reference of
    `10^3`, a hedged `\\boxed{3, 4}`) the final answer goes to `math-verify`, as TRL's `accuracy_reward` does.
    `use_math_verify`: `None` uses it when installed; `False` grades plain numbers only (anything else is wrong).

    Raises:
        ImportError: `use_math_verify=True` without `math-verify`.
        ValueError: a `reference` that is not a plain number without `math-verify` (it could not be graded).
    """
    if use_math_verify is None:
        use_math_verify = math_verify_available()
    elif use_math_verify and not math_verify_available():
        raise ImportError('use_math_verify=True needs math-verify: pip install "trl-reasoning[math]".')
    expected = plain_number(str(reference))
    span, boxed = _answer_span(text)
    predicted = _span_number(span, boxed)
    if expected is not None and (predicted is not None or not boxed):
        return float(predicted is not None and predicted == expected)
    if use_math_verify:
        return float(_math_verify_equal(str(reference), text, span if boxed else None))
    if expected is None:
        raise ValueError(
            f"The reference answer {str(reference)[:80]!r} is not a plain number; grading it needs math-verify: "
            'pip install "trl-reasoning[math]".'
        )
    warnings.warn(
        "math_answer_reward: a boxed answer that is not a plain number (LaTeX such as \\frac{1}{2}, or a list) is "
        'counted as wrong without math-verify; pip install "trl-reasoning[math]" to grade it.',
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return 0.0


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
    1.0 when the completion's final answer equals the `answer` column, else 0.0 ([`grade_answer`]). `answer` is a
    number, a LaTeX expression (graded by math-verify), or a full GSM8K solution ending in `#### <number>`.
    """
    rewards = []
    for completion, reference in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        if "####" in str(reference):
            reference = extract_gsm8k_reference(str(reference))
        rewards.append(grade_answer(text, reference))
    return rewards


def format_gsm8k(example: dict[str, Any], system_prompt: str | None = GSM8K_SYSTEM_PROMPT) -> dict[str, Any]:
    """
    Map a GSM8K row (`question`, `answer`) to a conversational prompt and the reference number in `answer`, for
    `dataset.map(format_gsm8k)`.
    """
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": example["question"]})
    return {"prompt": messages, "answer": extract_gsm8k_reference(example["answer"])}
