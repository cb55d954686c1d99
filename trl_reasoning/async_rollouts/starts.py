"""How each generator of asynchronous rollouts starts, by the name ``async_generator`` takes: one registry, which each
generator module joins when it is imported (``async_rollouts/__init__.py`` imports them all).

A generator's name, help, run shape and refusals are declared once, in ``trl_reasoning.async_generators``, where the
config reads them too; its module here registers only what the config cannot hold: the function that starts it for a
run (``register_generator``). A name must be declared before it registers, and a test keeps the two lists equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..async_generators import FIELD, GENERATORS

if TYPE_CHECKING:
    from .protocols import AsyncRolloutHost, Generator, WeightTransport

#: ``start(host, model_swap)``: what starts the generator for the run of trainer ``host`` (called by the pipeline at
#: its first submission). ``model_swap`` puts a job's behaviour weights in the trainer's own model (the in-process
#: generator samples there; TRL's weight sync sends them from there to a vLLM server).
StartFunction = Callable[["AsyncRolloutHost", "WeightTransport"], Callable[[], "Generator"]]

_STARTS: dict[str, StartFunction] = {}


def register_generator(name: str) -> Callable[[StartFunction], StartFunction]:
    """Decorator: register the start function of the generator declared as ``name`` in
    ``trl_reasoning.async_generators`` (an undeclared name raises, listing the declared ones); a name registers once."""
    GENERATORS.get(name)

    def decorator(start: StartFunction) -> StartFunction:
        if not callable(start):
            raise TypeError(f"{FIELD} {name!r}: a generator registers its start function, got {start!r}")
        if name in _STARTS:
            raise ValueError(f"{FIELD} {name!r} is already registered")
        _STARTS[name] = start
        return start

    return decorator


def unregister_generator(name: str) -> None:
    """Remove the start function of ``name`` (a generator registered for a test); an unknown name raises."""
    generator_start(name)
    del _STARTS[name]


def generator_start(name: str) -> StartFunction:
    """The start function registered as ``name``; an unknown name raises a ``ValueError`` naming ``async_generator``
    and the registered names."""
    try:
        return _STARTS[name]
    except KeyError:
        raise ValueError(f"Unknown {FIELD} {name!r}. Allowed values: {', '.join(_STARTS)}.") from None


def registered_generators() -> tuple[str, ...]:
    """The names with a start function, in registration order."""
    return tuple(_STARTS)
