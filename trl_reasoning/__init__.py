"""trl-reasoning: DAPO, CISPO, GSPO, REINFORCE++, ProRL, DPPO, MaxRL, RLOO, Dr. GRPO and ScaleRL as drop-in TRL
trainers.

Swap ``GRPOTrainer``/``GRPOConfig`` for ``DAPOTrainer``/``DAPOConfig`` (or another preset) and keep the rest.

Importing the package imports none of its parts (nor TRL, transformers or torch): each name is imported where it is
first used, as ``import trl`` does, so ``import trl_reasoning`` is quick and prints nothing. (transformers imports
peft, and peft bitsandbytes, when they are installed; bitsandbytes logs a warning when its optional CPU kernels are
missing. That happens on the first use of a config or a trainer, as on ``from trl import GRPOConfig``.)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below resolve to, for type checkers and editors
    from .algorithms.advantages import compute_advantages  # noqa: F401
    from .algorithms.aggregation import aggregate_loss, completion_weights  # noqa: F401
    from .algorithms.losses import compute_policy_loss  # noqa: F401
    from .config import ReasoningConfig  # noqa: F401
    from .evaluation.callbacks import PassAtKCallback, evaluate_pass_at_k  # noqa: F401
    from .evaluation.compute_curves import ComputeCurveFit, fit_compute_curve  # noqa: F401
    from .evaluation.pass_at_k import mean_pass_at_k, pass_at_k  # noqa: F401
    from .models.model_card import ReasoningModelCardMixin  # noqa: F401
    from .presets import *  # noqa: F403
    from .rewards.wrapping import RewardFunctionError, overlong_penalty  # noqa: F401
    from .trainer.base import ReasoningTrainer  # noqa: F401
    from .trainer.guards import LaunchWarning, NonFiniteLossError, NonFiniteLossWarning  # noqa: F401
    from .trainer.rollout import DynamicSamplingWarning  # noqa: F401
    from .trainer.trl_api import TRLCompatibilityError, warn_if_trl_unsupported  # noqa: F401


__version__ = "0.1.0"

#: Each public name (but the presets') and the module that defines it, imported from there on first use. A trainer's
#: or a config's name imports ``trl_reasoning.trainer`` first, whose import warns when the installed TRL is not a
#: supported version.
_EXPORTS: dict[str, str] = {
    "compute_advantages": "algorithms.advantages",
    "aggregate_loss": "algorithms.aggregation",
    "completion_weights": "algorithms.aggregation",
    "compute_policy_loss": "algorithms.losses",
    "PassAtKCallback": "evaluation.callbacks",
    "evaluate_pass_at_k": "evaluation.callbacks",
    "ComputeCurveFit": "evaluation.compute_curves",
    "fit_compute_curve": "evaluation.compute_curves",
    "mean_pass_at_k": "evaluation.pass_at_k",
    "pass_at_k": "evaluation.pass_at_k",
    "ReasoningModelCardMixin": "models.model_card",
    "RewardFunctionError": "rewards.wrapping",
    "overlong_penalty": "rewards.wrapping",
    "ReasoningConfig": "config",
    "ReasoningTrainer": "trainer.base",
    "TRLCompatibilityError": "trainer.trl_api",
    "warn_if_trl_unsupported": "trainer.trl_api",
    "LaunchWarning": "trainer.guards",
    "NonFiniteLossError": "trainer.guards",
    "NonFiniteLossWarning": "trainer.guards",
    "DynamicSamplingWarning": "trainer.rollout",
}


def _public_names() -> list[str]:
    """``__all__``: the names above, then every preset's config and trainer, ``PRESETS``, ``Preset`` and ``preset``
    from ``trl_reasoning.presets`` (whose ``__all__`` a test keeps equal to ``PRESETS``: a new preset needs no line
    here)."""
    names = [name for name in _EXPORTS if name != "warn_if_trl_unsupported"]
    return names + list(importlib.import_module(".presets", __name__).__all__)


def __getattr__(name: str) -> Any:
    """A public name (or a submodule) of the package, imported on first use and kept in the package's namespace."""
    if name == "__all__":
        value = _public_names()
    elif name in _EXPORTS:
        if _EXPORTS[name] == "config":  # as for the trainer's names (trainer.*): the import that checks TRL's version
            importlib.import_module(".trainer", __name__)
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name.startswith("_"):  # no public name starts with one: answered without importing anything
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        presets = importlib.import_module(".presets", __name__)
        if name not in presets.__all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(presets, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_public_names(), *_EXPORTS})
