"""trl-reasoning: DAPO, CISPO, DPPO, MaxRL, RLOO, Dr. GRPO and ScaleRL as drop-in TRL trainers.

Swap ``GRPOTrainer``/``GRPOConfig`` for ``DAPOTrainer``/``DAPOConfig`` (or another preset) and keep the rest.
"""

from .advantages import compute_advantages
from .aggregation import aggregate_loss, completion_weights
from .callbacks import PassAtKCallback, evaluate_pass_at_k
from .cispo import CISPOConfig, CISPOTrainer
from .dapo import DAPOConfig, DAPOTrainer
from .dppo import DPPOConfig, DPPOTrainer
from .dr_grpo import DrGRPOConfig, DrGRPOTrainer
from .evaluation import mean_pass_at_k, pass_at_k
from .guards import LaunchWarning, NonFiniteLossError, NonFiniteLossWarning
from .losses import compute_policy_loss
from .maxrl import MaxRLConfig, MaxRLTrainer
from .model_card import ReasoningModelCardMixin
from .rewards import RewardFunctionError, overlong_penalty
from .rloo import RLOOConfig, RLOOTrainer
from .rollout import DynamicSamplingWarning
from .scalerl import ScaleRLConfig, ScaleRLTrainer
from .scaling import ComputeCurveFit, fit_compute_curve
from .trainer import (
    ReasoningConfig,
    ReasoningTrainer,
    TRLCompatibilityError,
    warn_if_trl_unsupported,
)

__version__ = "0.1.0"

warn_if_trl_unsupported()

__all__ = [
    "CISPOConfig",
    "ComputeCurveFit",
    "CISPOTrainer",
    "DAPOConfig",
    "DAPOTrainer",
    "DPPOConfig",
    "DPPOTrainer",
    "DrGRPOConfig",
    "DrGRPOTrainer",
    "DynamicSamplingWarning",
    "LaunchWarning",
    "NonFiniteLossError",
    "NonFiniteLossWarning",
    "MaxRLConfig",
    "MaxRLTrainer",
    "RLOOConfig",
    "RLOOTrainer",
    "PassAtKCallback",
    "ReasoningConfig",
    "ReasoningModelCardMixin",
    "ReasoningTrainer",
    "ScaleRLConfig",
    "ScaleRLTrainer",
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
