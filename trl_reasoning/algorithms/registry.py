"""A tiny name -> function registry, shared by the math modules.

Adding a variant (an advantage estimator, a policy loss, an aggregation) is one decorated function:
the trainer looks functions up by the name given in the config, so nothing else changes. A variant declares itself in
its registration, and the config and the trainer ask the registry instead of comparing names:

- its config fields (:class:`VariantField`: name, default, help, the function parameter each fills, a check of the
  value), which the trainer hands to the function (``config_kwargs``) and ``ReasoningConfig`` validates;
- the checks it makes on the whole config when it is chosen (``checks``: callables that raise a ``ValueError``
  naming the field, or warn);
- its traits (``traits(name)``, read as attributes): what else it needs or changes (its ratio is the sequence's, it takes its ratio to the
  sampler, its weights come from the micro-batch, it needs binary rewards, ...). Each registry takes the traits of
  one frozen dataclass (``LossTraits`` in losses.py, ``EstimatorTraits`` in advantages.py, ...), whose fields say
  what each trait means; a trait that is not one of its fields raises a ``TypeError`` at registration.

Its one-line description is the first paragraph of its docstring (``description``). The remaining keyword
parameters are filled by name from what the trainer has (``kwargs_for``).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)

#: ``check(field_name, value)``: raises a ``ValueError`` naming ``field_name`` when ``value`` is not allowed.
FieldCheck = Callable[[str, Any], None]
#: ``check(config)``: run when the variant is chosen; raises a ``ValueError`` naming the field (or warns).
ConfigCheck = Callable[[Any], None]


@dataclass(frozen=True)
class VariantField:
    """A config field a variant reads.

    Attributes:
        name: the field of ``ReasoningConfig`` (for example ``"dppo_threshold"``).
        default: its default; ``ReasoningConfig`` declares the field with it (a test keeps TRL's own fields equal).
        help: what the field means (its ``--help`` text when trl-reasoning declares it).
        parameter: the keyword parameter of the variant's function the value fills, or ``None`` when another part
            reads it (for example ``dppo_topk``, read at generation time).
        check: ``check(name, value)`` raising a ``ValueError`` naming the field, run on every config.
        defined_by_trl: the field is TRL's (``GRPOConfig`` declares it); only its routing is declared here.
    """

    name: str
    default: Any
    help: str
    parameter: str | None = None
    check: FieldCheck | None = None
    defined_by_trl: bool = False


def with_variant_field_entries(doc: str, fields: Mapping[str, VariantField], annotations: Mapping[str, str]) -> str:
    """``doc`` with each ``{variant field NAME}`` line replaced by that field's entry, written from its declaration
    in the registry (help and default) and its annotation: a variant field's meaning is written once, where the
    variant declares it (``VariantField.help``, also its ``--help`` text)."""

    def entry(match: re.Match[str]) -> str:
        name = match.group(1)
        declared = fields[name]
        kind = " or ".join(f"`{part.strip()}`" for part in annotations[name].split("|"))
        default = f'"{declared.default}"' if isinstance(declared.default, str) else str(declared.default)
        indent = " " * 12
        text = textwrap.fill(
            declared.help, 120, initial_indent=indent, subsequent_indent=indent, break_long_words=False
        )
        return f"        {name} ({kind}, *optional*, defaults to `{default}`):\n{text}"

    return re.sub(r"^ {8}\{variant field (\w+)\}$", entry, doc, flags=re.MULTILINE)


def one_of(values: Iterable[str]) -> FieldCheck:
    """A field check: the value must be one of ``values`` (the error lists them)."""
    allowed = tuple(values)

    def check(name: str, value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"Unknown {name} {value!r}. Allowed values: {', '.join(allowed)}.")

    return check


def at_least(minimum: float, *, integer: bool = False, optional: bool = False, note: str = "") -> FieldCheck:
    """A field check: the value must be ``>= minimum`` (an ``int``, not a ``bool``, when ``integer``; ``None`` passes
    when ``optional``). ``note`` says why, in the error."""
    kind = "an int " if integer else ""
    why = f" ({note})" if note else ""

    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        wrong_type = integer and (isinstance(value, bool) or not isinstance(value, int))
        if wrong_type or value is None or value < minimum:
            raise ValueError(f"{name} must be {kind}>= {minimum}{why}, got {value!r}.")

    return check


def trait_field(meaning: str, default: Any = None) -> Any:
    """A field of a traits dataclass: its ``default`` (``None``, ``False``: the variant does not have the trait) and
    its one-line ``meaning``, which the trait table of docs/configuration.md shows."""
    return dataclasses.field(default=default, metadata={"help": meaning})


@dataclass(frozen=True)
class NoTraits:
    """The traits of a kind of variant that has none (group selections)."""


def trait_names(traits_class: type) -> tuple[str, ...]:
    """The names of the traits ``traits_class`` declares, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(traits_class))


class Registry(Generic[F]):
    """Maps names to functions of one kind (e.g. ``"advantage estimator"``), each registered with the traits of
    ``traits`` (a frozen dataclass whose fields are the traits this kind of variant may have)."""

    def __init__(self, kind: str, traits: type = NoTraits) -> None:
        self.kind = kind
        self.traits_class = traits
        self._functions: dict[str, F] = {}
        self._traits: dict[str, Any] = {}
        self._fields: dict[str, tuple[VariantField, ...]] = {}
        self._checks: dict[str, tuple[ConfigCheck, ...]] = {}
        # name -> the keyword names its function takes (None: it takes **kwargs). Filled at registration: the
        # trainer asks on every step, and inspect.signature costs tens of microseconds a call.
        self._parameters: dict[str, frozenset[str] | None] = {}

    def register(
        self,
        name: str,
        *,
        fields: Iterable[VariantField] = (),
        checks: Iterable[ConfigCheck] = (),
        **traits: Any,
    ) -> Callable[[F], F]:
        """Decorator that registers ``fn`` under ``name`` with the config ``fields`` it reads, the ``checks`` it makes
        on a config that chooses it, and its ``traits`` (fields of the registry's traits dataclass: an unknown one
        raises a ``TypeError`` naming it and the known ones); a name can be registered once."""
        self._check_trait_names(f"{self.kind} {name!r}", traits)
        declared_traits = self.traits_class(**traits)

        def decorator(fn: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            parameters = inspect.signature(fn).parameters.values()
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
            self._functions[name] = fn
            self._traits[name] = declared_traits
            self._fields[name] = tuple(fields)
            self._checks[name] = tuple(checks)
            self._parameters[name] = None if takes_any else frozenset(p.name for p in parameters)
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a variant registered for a test or an experiment); an unknown name raises."""
        self.get(name)
        del self._functions[name], self._traits[name], self._parameters[name]
        del self._fields[name], self._checks[name]

    def _check_trait_names(self, where: str, keys: Iterable[str]) -> None:
        """Raise a ``TypeError`` naming every key of ``keys`` that is not a trait of this registry, and the known ones."""
        known = trait_names(self.traits_class)
        unknown = [key for key in keys if key not in known]
        if unknown:
            raise TypeError(
                f"{where}: unknown trait{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}. "
                f"The traits of a {self.kind} ({self.traits_class.__name__}): {', '.join(known) or 'none'}."
            )

    def traits(self, name: str) -> Any:
        """The traits ``name`` was registered with (an instance of the registry's frozen traits dataclass), read as
        attributes (``ADVANTAGE_ESTIMATORS.traits(name).kl_in_return``): an unset trait is the dataclass's default."""
        self.get(name)
        return self._traits[name]

    def with_trait(self, key: str) -> tuple[str, ...]:
        """The names registered with a true trait ``key``, in registration order."""
        self._check_trait_names(f"{self.kind} registry", (key,))
        return tuple(name for name in self._functions if getattr(self._traits[name], key))

    def takes(self, name: str, parameter: str) -> bool:
        """Whether the function ``name`` takes the keyword ``parameter`` (any keyword, when it takes ``**kwargs``)."""
        return bool(self.kwargs_for(name, {parameter: None}))

    def kwargs_for(self, name: str, available: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of ``available`` that the function ``name`` takes as parameters (all of them when it takes
        ``**kwargs``): callers offer everything they have and never branch on the name."""
        self.get(name)  # an unknown name raises with the allowed values
        parameters = self._parameters[name]
        if parameters is None:
            return dict(available)
        return {key: value for key, value in available.items() if key in parameters}

    def fields(self, name: str) -> tuple[VariantField, ...]:
        """The config fields ``name`` declared, in declaration order."""
        self.get(name)
        return self._fields[name]

    def declared_fields(self) -> dict[str, VariantField]:
        """Every declared config field by its name, over all variants (first declaration wins)."""
        declared: dict[str, VariantField] = {}
        for fields in self._fields.values():
            for variant_field in fields:
                declared.setdefault(variant_field.name, variant_field)
        return declared

    def config_kwargs(self, name: str, config: Any) -> dict[str, Any]:
        """``{parameter: value}`` of the fields ``name`` declared with a parameter, read from ``config``."""
        return {f.parameter: getattr(config, f.name) for f in self.fields(name) if f.parameter is not None}

    def check_fields(self, config: Any) -> None:
        """Run every declared field's check on its value in ``config``, whichever variant is chosen."""
        for variant_field in self.declared_fields().values():
            if variant_field.check is not None:
                variant_field.check(variant_field.name, getattr(config, variant_field.name))

    def check_config(self, name: str, config: Any) -> None:
        """Run the checks ``name`` declared on a ``config`` that chooses it."""
        self.get(name)  # an unknown name raises with the allowed values
        for check in self._checks[name]:
            check(config)

    def description(self, name: str) -> str:
        """The first paragraph of the docstring of ``name``'s function, on one line."""
        doc = inspect.getdoc(self.get(name)) or ""
        return " ".join(doc.split("\n\n", 1)[0].split())

    def get(self, name: str) -> F:
        """The function registered as ``name``; an unknown name raises a ``ValueError`` listing the known ones."""
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(f"Unknown {self.kind} {name!r}. Allowed values: {', '.join(self.names())}.") from None

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order."""
        return tuple(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions
