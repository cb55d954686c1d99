"""The evidence testbed's task: sums of digit chains with an optional scratchpad.

The prompt is ``sum 3 5 8 2`` and the answer is ``18``. A completion may show its work as running sums before the
answer (``8 16 18=18``) or answer at once (``=18``); the reward reads only what follows the last ``=``. Why this task
can separate the algorithms where digit reversal cannot (``bench/miniature.py`` explains the claims it tests):

* **The policy controls its length, and wrong answers can be long.** Whether to write the scratchpad, how many partial
  sums, and whether to stop are all the policy's choices; a slip in one partial sum makes a long wrong completion.
  A length-normalized loss that treats long wrong answers more gently (the bias Dr. GRPO removes) has room to show.
* **Difficulty spreads with the chain.** Two terms are a lookup the warm start mostly knows; six terms need five
  correct partial sums in a row. Long chains are solved sometimes (pass@1 far below pass@16), which is where
  pass@k-oriented objectives (MaxRL) and dynamic sampling (DAPO) have something to act on.
* **The teacher is sloppy in two ways.** It skips the scratchpad on ``skip_rate`` of its demonstrations (its direct
  answers are right, but a tiny model cannot imitate mental arithmetic on long chains) and slips on each partial
  sum with probability ``slip_rate``, so the warm start inherits both short guesses and long wrong chains, and the
  longer the chain the more often it was shown a wrong one.

Everything is generated from a seed, offline. Off-policy stress is a training setting, not a task: the bench reuses
each batch of rollouts for several optimizer steps (``num_iterations`` and ``steps_per_generation``).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any

from .digit_reversal import _completion_text

_ANSWER = re.compile(r"=\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class ChainSumTask:
    """
    A seeded set of digit-chain sums with disjoint train and held-out splits.

    Parameters:
        min_terms (`int`, *optional*, defaults to `2`), max_terms (`int`, *optional*, defaults to `8`):
            Chain lengths; every length in between is equally frequent in both splits.
        num_train (`int`, *optional*, defaults to `4000`):
            Number of training problems (drawn with replacement among the chains not held out).
        num_test_per_length (`int`, *optional*, defaults to `40`):
            Held-out problems per chain length (distinct, never in the training split).
        skip_rate (`float`, *optional*, defaults to `0.5`):
            Fraction of warm-start demonstrations that answer without a scratchpad.
        slip_rate (`float`, *optional*, defaults to `0.04`):
            Probability that the teacher slips on each partial sum of a scratchpad (off by 1 or 2, carried on to a
            wrong answer), so long chains are demonstrated wrongly more often: a chain of ``n`` terms is worked
            without a slip with probability ``(1 - slip_rate) ** (n - 1)``.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the problem generator and of the teacher's choices.
    """

    min_terms: int = 2
    max_terms: int = 8
    num_train: int = 4000
    num_test_per_length: int = 40
    skip_rate: float = 0.5
    slip_rate: float = 0.04
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(
                f"ChainSumTask: need 2 <= min_terms <= max_terms, got min_terms={self.min_terms}, "
                f"max_terms={self.max_terms}."
            )
        if self.num_train < 1 or self.num_test_per_length < 1:
            raise ValueError(
                f"ChainSumTask: num_train and num_test_per_length must be >= 1, got {self.num_train} and "
                f"{self.num_test_per_length}."
            )
        if 2 * self.num_test_per_length > 9**self.min_terms:
            raise ValueError(
                f"ChainSumTask: num_test_per_length={self.num_test_per_length} would hold out more than half of the "
                f"{9**self.min_terms} chains of {self.min_terms} terms."
            )
        for name in ("skip_rate", "slip_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"ChainSumTask: {name} must be in [0, 1), got {getattr(self, name)}.")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **asdict(self)}

    @staticmethod
    def question(terms: tuple[int, ...]) -> str:
        return "sum " + " ".join(map(str, terms))

    @staticmethod
    def scratchpad(terms: tuple[int, ...]) -> str:
        """The worked completion: the running sums after the first term, then ``=`` and the total."""
        partial, sums = terms[0], []
        for term in terms[1:]:
            partial += term
            sums.append(partial)
        return " ".join(map(str, sums)) + f"={partial}"

    def splits(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Training and held-out chains (deterministic in `seed`; no held-out chain appears in training)."""
        rng = random.Random(self.seed)
        held_out: set[tuple[int, ...]] = set()
        test = []
        for length in range(self.min_terms, self.max_terms + 1):
            drawn: set[tuple[int, ...]] = set()
            while len(drawn) < self.num_test_per_length:
                drawn.add(tuple(rng.randint(1, 9) for _ in range(length)))
            test += sorted(drawn)
            held_out |= drawn
        train = []
        while len(train) < self.num_train:
            terms = tuple(rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms)))
            if terms not in held_out:
                train.append(terms)
        return train, test

    def rl_rows(self, split: str) -> list[dict[str, Any]]:
        """Conversational prompts with their `answer` and `num_terms` columns, for `split` in `"train"`, `"test"`."""
        if split not in ("train", "test"):
            raise ValueError(f"ChainSumTask.rl_rows: split must be 'train' or 'test', got {split!r}.")
        train, test = self.splits()
        return [
            {
                "prompt": [{"role": "user", "content": self.question(terms)}],
                "answer": str(sum(terms)),
                "num_terms": len(terms),
            }
            for terms in (train if split == "train" else test)
        ]

    def warm_start_rows(self, tokenizer) -> list[dict[str, str]]:
        """Prompt/completion texts of the sloppy teacher on the training split (the prompt is the chat template with a
        generation prompt, what the RL trainer feeds the model)."""
        rng = random.Random(self.seed + 1)
        rows = []
        for terms in self.splits()[0]:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": self.question(terms)}], tokenize=False, add_generation_prompt=True
            )
            if rng.random() < self.skip_rate:
                completion = f"={sum(terms)}"
            else:
                worked = [terms[0]] + [
                    t + rng.choice([-2, -1, 1, 2]) if rng.random() < self.slip_rate else t for t in terms[1:]
                ]
                completion = self.scratchpad(tuple(worked))
            rows.append({"prompt": prompt, "completion": completion})
        return rows


def chain_sum_answer(completion: Any) -> str | None:
    """The number after the completion's last ``=`` when the completion ends with it, else None."""
    match = _ANSWER.search(_completion_text(completion).strip())
    return match.group(1) if match else None


def chain_sum_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the number after the completion's last ``=`` (and nothing after it) equals `answer`, else 0.0."""
    return [float(chain_sum_answer(c) == str(a).strip()) for c, a in zip(completions, answer)]
