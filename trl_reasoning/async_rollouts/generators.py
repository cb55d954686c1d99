"""The generators of asynchronous rollouts by name (``async_generator``): one registry, which each generator module
joins when it is imported (``async_rollouts/__init__.py`` imports them all).

A generator is a :class:`GeneratorBackend` subclass registered with :func:`register_generator` in its own module
(``inline_generator``, ``process_generator``, ``server_generator``): how to start it for a run (``start``), what it
cannot sample of a run (``unsupported``, for :func:`~trl_reasoning.async_rollouts.checks.check_ahead_generator`) and,
for one that leaves a run's sampling to TRL's own generation, why (``step_time_reason``). Its name, its help and the
checks it makes on a config are declared one floor down, in ``trl_reasoning.algorithms.async_generators``, where
``ReasoningConfig`` (floor 3, beside this package, which it never imports) reads them: a name must be declared there
before it registers here.

Adding a generator: declare it in ``algorithms/async_generators.py`` (name, help, config checks), write its module
here registering its backend, import that module in ``async_rollouts/__init__.py``, and give it a test and a line of
docs/async-rollouts.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..algorithms.async_generators import ASYNC_GENERATORS, FIELD
from ..algorithms.registry import Registry

if TYPE_CHECKING:
    from .protocols import AsyncRolloutHost, Generator, WeightTransport

#: The registered generators (each a :class:`GeneratorBackend` subclass), by the names ``async_generator`` takes.
GENERATORS: Registry = Registry(FIELD)

#: What no generator that samples ahead can honour, as :meth:`GeneratorBackend.unsupported` names it (the batch
#: geometry, ``MORE_OR_LESS_THAN_ONE_GENERATION``, is declared with the generators' config checks, which refuse it
#: at config construction).
A_ROLLOUT_FUNC = (
    "a rollout_func (it samples the batches ahead itself and would never call it: async_generator='inline' calls "
    "it with the behaviour weights in the model, and a vLLM engine synced with them)"
)


@dataclass(frozen=True)
class AheadRun:
    """What a generator that samples ahead needs to know of a run to say what it cannot sample as TRL's
    ``_generate`` would (the arguments of :func:`~trl_reasoning.async_rollouts.checks.check_ahead_generator`)."""

    uses_vllm: bool
    vllm_mode: str | None
    tools: bool
    vision_language: bool
    one_generation_per_step: bool
    quantized: bool
    rollout_func: bool = False
    continuous_batching: bool = False
    environments: bool = False  # environment_factory (``tools`` is True with it too)
    processes: int = 1  # training processes
    engine_topk: bool = False  # DPPO's top-K divergence read from the engine's own top-K (vLLM)


class GeneratorBackend:
    """A generator of asynchronous rollouts, as the pipeline starts it. Subclasses override :meth:`start` and, where
    they refuse something, :meth:`unsupported`; the class's docstring says what it is for developers (the user's help
    is the declaration's, in ``trl_reasoning.algorithms.async_generators``)."""

    #: Whether it samples ahead (an ``AheadPipeline``) also where the run keeps the last ``k + 1`` snapshots (dynamic
    #: sampling's extra rounds, DPPO's top-K from the model): ``False``, it then leaves the run to TRL's generation.
    samples_ahead_with_snapshots: bool = True

    @staticmethod
    def start(host: AsyncRolloutHost, model_swap: WeightTransport) -> Callable[[], Generator]:
        """What starts the generator for the run of trainer ``host`` (at the pipeline's first submission), after
        checking the run fits it. ``model_swap`` puts a job's behaviour weights in the trainer's own model (the
        in-process generator samples there; TRL's weight sync sends them from there to a vLLM server)."""
        raise NotImplementedError

    @staticmethod
    def unsupported(run: AheadRun) -> list[str]:
        """What of ``run`` it cannot sample as TRL's ``_generate`` would, each with its way out (none: ``[]``)."""
        return []

    @staticmethod
    def step_time_reason(host: AsyncRolloutHost) -> str | None:
        """Why it leaves this run's batches to TRL's own generation, each at its step with the weights of ``k``
        steps earlier (so the run keeps their snapshots); ``None``: it samples them ahead."""
        return None


def register_generator(name: str) -> Callable[[type[GeneratorBackend]], type[GeneratorBackend]]:
    """Class decorator: register a :class:`GeneratorBackend` subclass as ``name``, a name declared in
    ``trl_reasoning.algorithms.async_generators`` (an undeclared one raises, listing the declared ones)."""
    ASYNC_GENERATORS.get(name)

    def decorator(backend: type[GeneratorBackend]) -> type[GeneratorBackend]:
        if not (isinstance(backend, type) and issubclass(backend, GeneratorBackend)):
            raise TypeError(f"{FIELD} {name!r}: a generator is a GeneratorBackend subclass, got {backend!r}")
        return GENERATORS.register(name)(backend)

    return decorator


def generator_backend(name: Any) -> type[GeneratorBackend]:
    """The generator registered as ``name``; an unknown name raises a ``ValueError`` naming ``async_generator`` and
    the registered names."""
    return GENERATORS.get(name)


def generator_help(name: str) -> str:
    """The one-line help of the generator ``name`` (its declaration's)."""
    generator_backend(name)
    return ASYNC_GENERATORS.description(name)
