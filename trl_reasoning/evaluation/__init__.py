"""Floor 2, evaluation: the unbiased pass@k estimator, sampling-based evaluation callbacks, and ScaleRL's
sigmoid compute-curve fit. No trainer import.

``trl_reasoning.evaluation`` was the pass@k module in 0.1; its names are still importable from here.
"""

from .pass_at_k import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
