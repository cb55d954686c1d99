"""One-step arithmetic for a small instruct model: the real-model main job's task family.

Questions such as ``What is 7 + 6?``, generated from a seed, with disjoint training and held-out sets (no question of
the held-out set appears in training). The reward is 1 when the *last* number of the reply is the answer.
SmolLM2-135M-Instruct knows one-digit sums, but it explains instead of answering ("To add 7 and 6, you simply add
them together: 7...") and is cut off, or ends on another number: its greedy reply is right 28% of the time and a reply
sampled at temperature 1 (as GRPO samples) 9% (64 held-out questions, measured here). RL teaches it to end with the
sum; the held-out accuracy and pass@1 show it. With the instruction " Reply with only the number." the greedy reply is
already right 88% of the time and a sampled one 16%.

Kinds: ``add`` (a + b, one digit each), ``sub`` (a - b >= 0), ``mul`` (a times b, 2..9), ``compare`` (the larger of
two two-digit numbers). Every question is asked once per split; the held-out set is drawn first, then the training set
from the rest (repeated when it is smaller than ``num_train``, which one-digit sums are: there are 81).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any

from .registry import TASKS, CliTask

_NUMBER = re.compile(r"-?\d+")


def _question(kind: str, a: int, b: int) -> tuple[str, int]:
    if kind == "add":
        return f"What is {a} + {b}?", a + b
    if kind == "sub":
        return f"What is {a} - {b}?", a - b
    if kind == "mul":
        return f"What is {a} times {b}?", a * b
    if kind == "compare":
        return f"Which is larger, {a} or {b}?", max(a, b)
    raise ValueError(f"Unknown arithmetic kind {kind!r}. Allowed values: {', '.join(KINDS)}.")


def _operands(kind: str) -> list[tuple[int, int]]:
    if kind == "add":
        return [(a, b) for a in range(1, 10) for b in range(1, 10)]
    if kind == "sub":
        return [(a, b) for a in range(2, 19) for b in range(1, 10) if 0 <= a - b <= 9]
    if kind == "mul":
        return [(a, b) for a in range(2, 10) for b in range(2, 10)]
    if kind == "compare":
        return [(a, b) for a in range(10, 100, 3) for b in range(11, 100, 7) if a != b]
    raise ValueError(f"Unknown arithmetic kind {kind!r}. Allowed values: {', '.join(KINDS)}.")


KINDS = ("add", "sub", "mul", "compare")


@dataclass(frozen=True)
class ArithmeticTask:
    """
    Seeded one-step arithmetic questions with a held-out set.

    Parameters:
        kinds (`tuple[str, ...]`, *optional*, defaults to `("add",)`):
            Which questions: `"add"`, `"sub"`, `"mul"`, `"compare"` (see the module docstring).
        num_train (`int`, *optional*, defaults to `1024`):
            Training rows (questions repeat when there are fewer distinct ones).
        num_test (`int`, *optional*, defaults to `32`):
            Held-out questions, none of which is in the training rows.
        instruction (`str`, *optional*, defaults to `""`):
            Appended to every question (e.g. `" Reply with only the number."`).
        system_prompt (`str` or `None`, *optional*, defaults to `None`):
            A system message; `None` leaves the model's chat template to add its default one.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the split and of the order.
    """

    kinds: tuple[str, ...] = ("add",)
    num_train: int = 1024
    num_test: int = 32
    instruction: str = ""
    system_prompt: str | None = None
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.kinds, str):
            object.__setattr__(self, "kinds", (self.kinds,))
        for kind in self.kinds:
            _operands(kind)  # raises on an unknown kind
        total = sum(len(_operands(kind)) for kind in self.kinds)
        if not 1 <= self.num_test < total:
            raise ValueError(
                f"ArithmeticTask: num_test must be between 1 and {total - 1} (there are {total} distinct questions of "
                f"kinds {', '.join(self.kinds)}), got {self.num_test}."
            )
        if self.num_train < 1:
            raise ValueError(f"ArithmeticTask: num_train must be >= 1, got {self.num_train}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def questions(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """``(train, test)`` lists of ``(question, answer)``: disjoint, deterministic in ``seed``."""
        rng = random.Random(self.seed)
        pool = [_question(kind, a, b) for kind in self.kinds for a, b in _operands(kind)]
        rng.shuffle(pool)
        test, rest = pool[: self.num_test], pool[self.num_test :]
        train = [rest[i % len(rest)] for i in range(self.num_train)]
        rng.shuffle(train)
        return train, test

    def messages(self, question: str) -> list[dict[str, str]]:
        system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return system + [{"role": "user", "content": question + self.instruction}]

    def rl_rows(self, split: str) -> list[dict[str, Any]]:
        """Conversational prompts with their ``answer`` column for ``split`` in ``"train"``, ``"test"``."""
        if split not in ("train", "test"):
            raise ValueError(f"ArithmeticTask.rl_rows: split must be 'train' or 'test', got {split!r}.")
        train, test = self.questions()
        return [{"prompt": self.messages(q), "answer": a} for q, a in (train if split == "train" else test)]


def _text(completion: Any) -> str:
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


def last_number(text: str) -> int | None:
    """The last integer written in ``text`` (thousands separators ignored), or ``None``."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


def last_number_reward(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 when the last number of the completion equals the ``answer`` column, else 0.0."""
    return [float(last_number(_text(c)) == int(a)) for c, a in zip(completions, answer, strict=True)]


TASKS.register(
    CliTask(
        name="arithmetic",
        help="one-step sums, the real-model main job's",
        reward="last_number_reward",
        build=ArithmeticTask,
    )
)
