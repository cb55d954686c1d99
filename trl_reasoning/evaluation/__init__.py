"""Floor 2, evaluation: the unbiased pass@k estimator, sampling-based evaluation callbacks, and ScaleRL's
sigmoid compute-curve fit. No trainer import.

The package exports the pass@k estimators (``pass_at_k``, ``mean_pass_at_k``).
"""

from .pass_at_k import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
