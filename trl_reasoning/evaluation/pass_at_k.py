"""Evaluation math: the unbiased pass@k estimator (pure Python, no TRL import).

pass@k is the probability that at least one of `k` completions, drawn without replacement from `n` sampled
completions of which `c` are correct, is correct (Chen et al., "Evaluating Large Language Models Trained on Code",
arXiv 2107.03374):

    pass@k = 1 − C(n − c, k) / C(n, k)

Averaged over prompts, it is an unbiased estimate of the chance that `k` fresh samples contain a correct one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""
    Unbiased pass@k of one prompt from `n` samples with `c` correct: `1 − C(n − c, k) / C(n, k)`.

    The ratio of binomials is computed as the product `∏_{i = n − c + 1}^{n} (1 − k / i)` (Chen et al., 2021), which
    stays in `[0, 1]` and never forms the huge binomial coefficients themselves.

    Args:
        n (`int`):
            Number of sampled completions (`n >= 1`).
        c (`int`):
            Number of correct completions among them (`0 <= c <= n`).
        k (`int`):
            Number of draws (`1 <= k <= n`).

    Returns:
        `float`: pass@k in `[0, 1]`. It is `0` when `c = 0`, and `1` when `n − c < k` (every draw of `k` contains a
        correct completion, e.g. `c = n`).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}.")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got n={n}.")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be between 0 and n={n}, got c={c}.")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be between 1 and n={n} (pass@k needs at least k samples), got k={k}.")
    if n - c < k:
        return 1.0
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure


def mean_pass_at_k(num_correct: Iterable[int], n: int | Sequence[int], k: int) -> float:
    """
    pass@k averaged over prompts.

    Args:
        num_correct (`Iterable[int]`):
            Number of correct completions of each prompt.
        n (`int` or `Sequence[int]`):
            Number of completions sampled per prompt: one int for all prompts, or one per prompt.
        k (`int`):
            Number of draws.

    Returns:
        `float`: the mean of [`pass_at_k`] over prompts.
    """
    counts = list(num_correct)
    if not counts:
        raise ValueError("mean_pass_at_k: num_correct is empty; there is nothing to average.")
    samples = [n] * len(counts) if isinstance(n, int) else list(n)
    if len(samples) != len(counts):
        raise ValueError(f"mean_pass_at_k: got {len(counts)} correct counts but {len(samples)} sample counts (n).")
    return math.fsum(pass_at_k(n_i, c_i, k) for n_i, c_i in zip(samples, counts)) / len(counts)
