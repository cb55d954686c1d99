"""The demo's verifiable tasks.

The main one is **digit reversal with a sloppy teacher**: the prompt is ``rev 4821`` and the only correct answer is
``1284``. The supervised warm start imitates a teacher that, most of the time, copies the digits instead of reversing
them, so the warm-started policy is right only sometimes (its greedy answer is usually the copy). RL with an
exact-match reward then has to find and reinforce the correct behaviour; the held-out split (digit strings never seen
in training) shows whether it generalizes. Everything is generated from a seed, offline.

The digit-fraction rewards at the bottom are the older, dense toy task used by the test suite.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from .registry import TASKS, CliTask


def _completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


@dataclass(frozen=True)
class ReversalTask:
    """
    A seeded set of digit-reversal problems with disjoint train and held-out splits.

    Parameters:
        num_digits (`int`, *optional*, defaults to `4`):
            Length of each digit string (leading zeros allowed, so every prompt has the same length).
        num_train (`int`, *optional*, defaults to `4000`):
            Number of training problems.
        num_test (`int`, *optional*, defaults to `200`):
            Number of held-out problems, disjoint from the training ones.
        teacher_error_rate (`float`, *optional*, defaults to `0.6`):
            Probability that a warm-start demonstration is the teacher's mistake (the digits copied, not reversed).
        seed (`int`, *optional*, defaults to `0`):
            Seed of the problem generator and of the teacher's mistakes.
    """

    num_digits: int = 4
    num_train: int = 4000
    num_test: int = 200
    teacher_error_rate: float = 0.6
    seed: int = 0

    def __post_init__(self):
        if self.num_digits < 2:
            raise ValueError(f"ReversalTask: num_digits must be >= 2, got {self.num_digits}.")
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError(
                f"ReversalTask: num_train and num_test must be >= 1, got {self.num_train} and {self.num_test}."
            )
        if self.num_train + self.num_test > 10**self.num_digits:
            raise ValueError(
                f"ReversalTask: num_train + num_test = {self.num_train + self.num_test} exceeds the "
                f"{10**self.num_digits} distinct {self.num_digits}-digit strings."
            )
        if not 0.0 <= self.teacher_error_rate < 1.0:
            raise ValueError(f"ReversalTask: teacher_error_rate must be in [0, 1), got {self.teacher_error_rate}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def question(digits: str) -> str:
        """The user message of a problem."""
        return f"rev {digits}"

    @staticmethod
    def answer(digits: str) -> str:
        """The correct answer of a problem."""
        return digits[::-1]

    def splits(self) -> tuple[list[str], list[str]]:
        """The training and held-out digit strings (disjoint, deterministic in `seed`)."""
        rng = random.Random(self.seed)
        numbers = rng.sample(range(10**self.num_digits), self.num_train + self.num_test)
        strings = [str(number).zfill(self.num_digits) for number in numbers]
        return strings[self.num_test :], strings[: self.num_test]

    def rl_rows(self, split: str) -> list[dict[str, Any]]:
        """Conversational prompts with their `answer` column, for `split` in `"train"`, `"test"`."""
        train, test = self.splits()
        if split not in ("train", "test"):
            raise ValueError(f"ReversalTask.rl_rows: split must be 'train' or 'test', got {split!r}.")
        return [
            {"prompt": [{"role": "user", "content": self.question(s)}], "answer": self.answer(s)}
            for s in (train if split == "train" else test)
        ]

    def warm_start_rows(self, tokenizer) -> list[dict[str, str]]:
        """Prompt/completion texts of the sloppy teacher's demonstrations on the training split. The prompt is the chat
        template applied with a generation prompt, exactly what the RL trainer will feed the model."""
        rng = random.Random(self.seed + 1)
        rows = []
        for digits in self.splits()[0]:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": self.question(digits)}], tokenize=False, add_generation_prompt=True
            )
            mistaken = rng.random() < self.teacher_error_rate
            rows.append({"prompt": prompt, "completion": digits if mistaken else self.answer(digits)})
        return rows


def exact_match_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the completion (surrounding whitespace stripped) equals the `answer` column, else 0.0."""
    return [float(_completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer)]


def digit_reward(completions, **kwargs) -> list[float]:
    """Fraction of the completion's characters that are digits (in [0, 1])."""
    texts = [_completion_text(c) for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]


def all_digits(completions, **kwargs) -> list[float]:
    """Binary version of the digits task, for MaxRL: 1 when most of the completion is digits."""
    return [float(r >= 0.5) for r in digit_reward(completions)]


TASKS.register(
    CliTask(
        name="reverse",
        help="the tiny demo's digit reversal",
        reward="exact_match_reward",
        build=ReversalTask,
        warm_start=True,
    )
)
