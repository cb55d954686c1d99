"""A tiny name -> function registry, shared by the math modules.

Adding a variant (an advantage estimator, a policy loss, an aggregation) is one decorated function:
the trainer looks functions up by the name given in the config, so nothing else changes. What a variant needs from
the trainer is declared, not special-cased by name: its keyword parameters are filled by name from what the trainer
has (``kwargs_for``), and ``traits`` given at registration say what else it needs or changes (``trait``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps names to functions of one kind (e.g. ``"advantage estimator"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        # name -> the keyword names its function takes (None: it takes **kwargs). Filled at registration: the
        # trainer asks on every step, and inspect.signature costs tens of microseconds a call.
        self._parameters: dict[str, frozenset[str] | None] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator that registers ``fn`` under ``name`` with optional ``traits``; a name can be registered once."""

        def decorator(fn: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            parameters = inspect.signature(fn).parameters.values()
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
            self._functions[name] = fn
            self._traits[name] = dict(traits)
            self._parameters[name] = None if takes_any else frozenset(p.name for p in parameters)
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a variant registered for a test or an experiment); an unknown name raises."""
        self.get(name)
        del self._functions[name], self._traits[name], self._parameters[name]

    def trait(self, name: str, key: str, default: Any = None) -> Any:
        """The trait ``key`` that ``name`` was registered with (``default`` when it has none)."""
        self.get(name)  # an unknown name raises with the allowed values
        return self._traits[name].get(key, default)

    def kwargs_for(self, name: str, available: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``available`` that the function ``name`` takes as parameters (all of them when it takes
        ``**kwargs``): callers offer everything they have and never branch on the name."""
        self.get(name)  # an unknown name raises with the allowed values
        parameters = self._parameters[name]
        if parameters is None:
            return dict(available)
        return {key: value for key, value in available.items() if key in parameters}

    def get(self, name: str) -> F:
        """The function registered as ``name``; an unknown name raises a ``ValueError`` listing the known ones."""
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(f"Unknown {self.kind} {name!r}. Allowed values: {', '.join(self.names())}.") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions
