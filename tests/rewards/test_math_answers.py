"""The math reward (``trl_reasoning.rewards.math_answers``): GSM8K extraction, plain numbers compared exactly without
math-verify, LaTeX and hedged answers graded by math-verify (as TRL's ``accuracy_reward``), and what happens without
it."""

from __future__ import annotations

import warnings

import pytest

from trl_reasoning.rewards import math_answers as rewards_math
from trl_reasoning.rewards.math_answers import (
    extract_final_answer,
    extract_gsm8k_reference,
    format_gsm8k,
    grade_answer,
    math_answer_reward,
    normalize_number,
    plain_number,
)


def test_gsm8k_answer_extraction_and_reward():
    assert extract_gsm8k_reference("She pays 3 * 4 = <<3*4=12>>12 dollars.\n#### 1,200") == "1200"
    assert extract_final_answer("so the total is \\boxed{\\frac{1}{2}} or \\boxed{42}") == "42"
    assert extract_final_answer("The answer is $1,234.50.") == "1234.5"
    assert extract_final_answer("Steps: 3 + 4 = 7, then 7 * 2 = 14") == "14"
    assert extract_final_answer("#### -3") == "-3" and extract_final_answer("no number") is None
    assert normalize_number("4.0") == "4" and normalize_number("0.50") == "0.5"
    completions = [[{"role": "assistant", "content": c}] for c in ("\\boxed{18}", "it is 17", "18.0 apples", "")]
    assert math_answer_reward(completions, answer=["18", "18", "#### 18", "18"]) == [1.0, 0.0, 1.0, 0.0]
    row = format_gsm8k({"question": "How many?", "answer": "2 + 2 = 4\n#### 4"})
    assert row["answer"] == "4" and row["prompt"][-1] == {"role": "user", "content": "How many?"}
    assert row["prompt"][0]["role"] == "system"
    with pytest.raises(ValueError, match="####"):
        extract_gsm8k_reference("no marker")


@pytest.mark.parametrize(
    "answer, number",
    [
        ("42", "42"),
        (" 1,234 ", "1234"),
        ("\\$3.50", "3.5"),
        ("$18", "18"),
        ("18 \\text{ dollars}", "18"),
        ("18\\,\\mathrm{cm}", "18"),
        ("-2.", "-2"),
        (".5", "0.5"),
        ("3, 4", None),
        ("3,4", None),  # not a thousands separator
        ("3 \\text{ or } 4", None),
        ("\\frac{1}{2}", None),
        ("10^3", None),
        ("3x", None),
        ("", None),
    ],
)
def test_plain_number(answer, number):
    assert plain_number(answer) == number


def test_hedged_boxed_answers_are_not_read_as_their_first_number():
    assert extract_final_answer("\\boxed{3, 4}") is None
    assert extract_final_answer("\\boxed{3 \\text{ or } 4}") is None
    assert extract_final_answer("\\boxed{1,000}") == "1000"


def test_plain_numbers_never_reach_math_verify(monkeypatch):
    def fail(*args):
        raise AssertionError("math-verify was called for a plain number")

    monkeypatch.setattr(rewards_math, "_math_verify_equal", fail)
    assert grade_answer("\\boxed{1,234}", "1234") == 1.0
    assert grade_answer("#### 71", "72") == 0.0
    assert grade_answer("The answer is 15. Then I checked.", "15") == 1.0
    assert grade_answer("no number at all", "15") == 0.0


LATEX_CASES = [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{10^3}", "1000", 1.0),
    ("\\boxed{\\sqrt{16}}", "4", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{3}}", "\\frac{1}{2}", 0.0),
    ("\\boxed{3, 4}", "3", 0.0),
    ("\\boxed{3,4}", "3", 0.0),
    ("\\boxed{3 \\text{ or } 4}", "4", 0.0),
]


@pytest.mark.parametrize("text, reference, expected", LATEX_CASES)
def test_latex_and_hedged_answers_are_graded_by_math_verify(text, reference, expected):
    pytest.importorskip("math_verify")
    assert grade_answer(text, reference) == expected


@pytest.mark.parametrize("text, reference, expected", LATEX_CASES)
def test_boxed_answers_agree_with_trls_accuracy_reward(text, reference, expected):
    """TRL's accuracy_reward (math-verify on the whole completion) is the independent oracle for boxed answers."""
    pytest.importorskip("math_verify")
    from trl.rewards import accuracy_reward

    assert accuracy_reward([[{"role": "assistant", "content": text}]], [reference]) == [expected]


def test_without_math_verify_latex_counts_as_wrong_and_a_latex_reference_is_an_error(monkeypatch):
    monkeypatch.setattr(rewards_math, "math_verify_available", lambda: False)
    with pytest.warns(
        UserWarning, match='counted as wrong without math-verify; pip install "trl-reasoning\\[math\\]"'
    ):
        assert grade_answer("\\boxed{\\frac{1}{2}}", "0.5") == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert grade_answer("\\boxed{0.5}", "0.5") == 1.0  # the fast path needs nothing
    with pytest.raises(ValueError, match="reference answer '\\\\\\\\frac\\{1\\}\\{2\\}' is not a plain number"):
        grade_answer("\\boxed{0.5}", "\\frac{1}{2}")
    with pytest.raises(ImportError, match="use_math_verify=True needs math-verify"):
        grade_answer("\\boxed{0.5}", "0.5", use_math_verify=True)


def test_use_math_verify_false_grades_plain_numbers_only():
    with pytest.warns(UserWarning, match="counted as wrong"):
        assert grade_answer("\\boxed{\\frac{1}{2}}", "0.5", use_math_verify=False) == 0.0
    assert grade_answer("\\boxed{0.5}", "0.50", use_math_verify=False) == 1.0
