"""A tiny name -> function registry, shared by the math modules.

Adding a variant (an advantage estimator, a policy loss, an aggregation) is one decorated function:
the trainer looks functions up by the name given in the config, so nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps names to functions of one kind (e.g. ``"advantage estimator"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that registers ``fn`` under ``name``; a name can be registered once."""

        def decorator(fn: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._functions[name] = fn
            return fn

        return decorator

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
