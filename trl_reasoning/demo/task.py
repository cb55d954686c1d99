"""The demo's verifiable toy task: answer with digits only."""

from __future__ import annotations


def digit_reward(completions, **kwargs) -> list[float]:
    """Fraction of the completion's characters that are digits (in [0, 1])."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]


def all_digits(completions, **kwargs) -> list[float]:
    """Binary version of the task, for MaxRL: 1 when most of the completion is digits."""
    return [float(r >= 0.5) for r in digit_reward(completions)]
