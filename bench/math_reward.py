"""The math reward's two paths on a fixed, hand-labelled set of completions: how often each grader agrees with the
label, and what it costs per completion.

Graders: ``number-only`` (``grade_answer(use_math_verify=False)``: plain numbers compared as decimals, anything else
wrong), ``trl-reasoning`` (the default: that fast path, and math-verify for everything that is not a plain number),
and TRL's own ``accuracy_reward`` (math-verify on every completion), in the same run. Time: median over ``--repeats``
passes of the per-completion wall time, per kind of case. TRL's grader expects LaTeX: answers after ``####``,
"the answer is" or as a last bare number are not extracted there (its three false negatives). Before math-verify was
the fallback, trl-reasoning's reward read the first number of every answer: 22/32 on this set, 3 false positives
(the hedged ``\boxed{3, 4}``-style answers), 7 false negatives. Usage:

    python bench/math_reward.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import record  # noqa: E402

#: (kind, completion, reference, correct?) — the label is what a careful human grader says.
CASES: list[tuple[str, str, str, bool]] = [
    # Plain numbers: the GSM8K bulk.
    ("plain", "3 + 4 = 7, so the answer is \\boxed{7}.", "7", True),
    ("plain", "Total: 12 * 3 = 36. \\boxed{36}", "36", True),
    ("plain", "She has \\boxed{1,234} stickers.", "1234", True),
    ("plain", "It costs \\boxed{\\$18}.", "18", True),
    ("plain", "\\boxed{18 \\text{ dollars}}", "18", True),
    ("plain", "\\boxed{3.50}", "3.5", True),
    ("plain", "\\boxed{-4}", "-4", True),
    ("plain", "#### 72", "72", True),
    ("plain", "The answer is 15.", "15", True),
    ("plain", "So 6 + 6 = 12 and then 12 / 4 = 3", "3", True),
    ("plain", "\\boxed{35}", "36", False),
    ("plain", "She has \\boxed{1,243} stickers.", "1234", False),
    ("plain", "#### 71", "72", False),
    ("plain", "The answer is 16.", "15", False),
    ("plain", "I am not sure.", "15", False),
    ("plain", "\\boxed{0.5}", "0.50", True),
    # LaTeX answers and references.
    ("latex", "\\boxed{\\frac{1}{2}}", "0.5", True),
    ("latex", "\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("latex", "\\boxed{10^3}", "1000", True),
    ("latex", "\\boxed{2^{10}}", "1024", True),
    ("latex", "\\boxed{\\frac{1}{3}}", "0.5", False),
    ("latex", "\\boxed{10^2}", "1000", False),
    ("latex", "\\boxed{0.5}", "\\frac{1}{2}", True),
    ("latex", "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
    ("latex", "\\boxed{\\sqrt{16}}", "4", True),
    ("latex", "\\boxed{\\frac{2}{3}}", "\\frac{1}{2}", False),
    # Hedged answers: more than one candidate is not the answer.
    ("hedged", "\\boxed{3, 4}", "3", False),
    ("hedged", "\\boxed{3,4}", "3", False),
    ("hedged", "\\boxed{3 \\text{ or } 4}", "3", False),
    ("hedged", "\\boxed{3 \\text{ or } 4}", "4", False),
    ("hedged", "\\boxed{1, 2, 3}", "1", False),
    ("hedged", "\\boxed{2 \\text{ and } 5}", "5", False),
]


def _completion(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def graders() -> dict:
    """name -> grade(text, reference) -> 0/1 (float), None when the grader skips the case."""
    from trl.rewards import accuracy_reward

    from trl_reasoning.rewards.math_answers import grade_answer

    return {
        "number-only": lambda text, ref: grade_answer(text, ref, use_math_verify=False),
        "trl-reasoning (fast path + math-verify)": lambda text, ref: grade_answer(text, ref),
        "TRL accuracy_reward (math-verify)": lambda text, ref: accuracy_reward([_completion(text)], [ref])[0],
    }


def evaluate(grade, cases, repeats: int) -> dict:
    """Agreement with the labels, false positives/negatives, and per-kind median seconds per completion."""
    verdicts, times = [], {kind: [] for kind, *_ in cases}
    for repeat in range(repeats):
        for kind, text, reference, _ in cases:
            started = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    verdict = grade(text, reference)
            except ValueError:  # a reference the grader cannot read: it cannot grade the case
                verdict = None
            times[kind].append(time.perf_counter() - started)
            if repeat == 0:
                verdicts.append(verdict)
    labels = [label for *_, label in cases]
    agree = sum(v is not None and bool(v) == label for v, label in zip(verdicts, labels))
    return {
        "agree": agree,
        "false_positive": sum(v is not None and bool(v) and not label for v, label in zip(verdicts, labels)),
        "false_negative": sum(v is not None and not v and label for v, label in zip(verdicts, labels)),
        "ungraded": sum(v is None for v in verdicts),
        "seconds": {kind: statistics.median(values) for kind, values in times.items()},
    }


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 repeat: checks the script runs")
    options = parser.parse_args(argv)
    repeats = 1 if options.quick else options.repeats
    kinds = list(dict.fromkeys(kind for kind, *_ in CASES))
    counts = {kind: sum(k == kind for k, *_ in CASES) for kind in kinds}
    lines = [
        f"Math reward graders on {len(CASES)} hand-labelled completions "
        f"({', '.join(f'{counts[k]} {k}' for k in kinds)}); CPU, median of {repeats} passes per completion "
        "(the first math-verify call of a process pays its imports, so the first pass is not special-cased: medians)",
        "",
        "| grader | agrees with label | false positives | false negatives | not graded | "
        + " | ".join(f"µs per {kind} case" for kind in kinds)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(kinds),
    ]
    for name, grade in graders().items():
        r = evaluate(grade, CASES, repeats)
        per_kind = " | ".join(f"{r['seconds'][kind] * 1e6:.0f}" for kind in kinds)
        lines.append(
            f"| {name} | {r['agree']}/{len(CASES)} | {r['false_positive']} | {r['false_negative']} | {r['ungraded']} "
            f"| {per_kind} |"
        )
    table = "\n".join(lines)
    print(table)
    if not options.quick:
        record("Math reward: fast path vs math-verify", table)
    return table


if __name__ == "__main__":
    main()
