"""trl-reasoning: DAPO, CISPO, DPPO, MaxRL, RLOO, Dr. GRPO and ScaleRL as drop-in TRL trainers.

Swap ``GRPOTrainer``/``GRPOConfig`` for ``DAPOTrainer``/``DAPOConfig`` (or another preset) and keep the rest.
"""

from . import _legacy_paths, presets
from .algorithms.advantages import compute_advantages
from .algorithms.aggregation import aggregate_loss, completion_weights
from .algorithms.losses import compute_policy_loss
from .evaluation.callbacks import PassAtKCallback, evaluate_pass_at_k
from .evaluation.compute_curves import ComputeCurveFit, fit_compute_curve
from .evaluation.pass_at_k import mean_pass_at_k, pass_at_k
from .models.model_card import ReasoningModelCardMixin
from .presets import *  # noqa: F403  every preset's config and trainer, PRESETS, Preset, preset (presets.__all__)
from .rewards.wrapping import RewardFunctionError, overlong_penalty
from .trainer.base import (
    ReasoningConfig,
    ReasoningTrainer,
    TRLCompatibilityError,
    warn_if_trl_unsupported,
)
from .trainer.guards import LaunchWarning, NonFiniteLossError, NonFiniteLossWarning
from .trainer.rollout import DynamicSamplingWarning

__version__ = "0.1.0"

# Old module paths (0.1: one flat package) import as their new homes, so pickled configs keep loading.
_legacy_paths.install()

warn_if_trl_unsupported()

__all__ = [
    "ComputeCurveFit",
    "DynamicSamplingWarning",
    "LaunchWarning",
    "NonFiniteLossError",
    "NonFiniteLossWarning",
    "PassAtKCallback",
    "ReasoningConfig",
    "ReasoningModelCardMixin",
    "ReasoningTrainer",
    "RewardFunctionError",
    "TRLCompatibilityError",
    "aggregate_loss",
    "compute_advantages",
    "completion_weights",
    "fit_compute_curve",
    "mean_pass_at_k",
    "compute_policy_loss",
    "evaluate_pass_at_k",
    "overlong_penalty",
    "pass_at_k",
]
# Every preset's config and trainer, from trl_reasoning.presets (whose __all__ a test keeps equal to PRESETS): a new
# preset needs no line here.
__all__ += presets.__all__
