"""Floor 4, the trainer: ``ReasoningTrainer`` (the only place that touches TRL's private methods, listed in
``trl_api.TRL_PRIVATE_API`` and checked against the installed TRL), the rollout side (generation rounds, scoring,
group selection), DPPO's top-K forward, checkpoint files, the non-finite-step guard and prompt-length checks.

The package exports the trainer and its config and the public names of the TRL-API guard (``trl_api.py``).
"""

from ..config import ReasoningConfig
from .base import ReasoningTrainer
from .trl_api import (
    SUPPORTED_TRL,
    TRL_CHECKED_VERSION,
    TRL_INSTANCE_ATTRIBUTES,
    TRL_PRIVATE_API,
    TRLCompatibilityError,
    check_trl_private_api,
    warn_if_trl_unsupported,
)

# The first import of a trainer or a config (``import trl_reasoning`` imports neither) says so when the installed TRL
# is not a version trl-reasoning supports.
warn_if_trl_unsupported()

__all__ = [
    "SUPPORTED_TRL",
    "TRL_CHECKED_VERSION",
    "TRL_INSTANCE_ATTRIBUTES",
    "TRL_PRIVATE_API",
    "ReasoningConfig",
    "ReasoningTrainer",
    "TRLCompatibilityError",
    "check_trl_private_api",
    "warn_if_trl_unsupported",
]
