"""Type checks for config dataclass fields, as TRL's YAML and command-line parsing apply them.

`TrlParser` (HF's `HfArgumentParser`) converts a string value by the field's type: `string_to_bool` for a `bool`
field, `int(...)`/`float(...)` for numbers. A config built in Python gets no such conversion, so
`DAPOConfig(dynamic_sampling="false")` would keep a truthy string and `epsilon_high="0.28"` would fail later with an
unrelated `TypeError`. [`coerce_field_types`] closes that gap at construction: strings are converted exactly as the
parser would, and values of the wrong kind are rejected with an error naming the field.

Only fields whose type is `bool`, `int` or `float` (optionally `| None`) are checked; a field whose type also admits
`str`, a list, a dict or an enum keeps its own validation. Pure Python: no TRL import.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from functools import cache
from typing import Any

from transformers.hf_argparser import string_to_bool

_NUMERIC = (bool, int, float)


class ConfigFieldTypeError(TypeError, ValueError):
    """A config field got a value of the wrong type (a `ValueError` too, as TRL's config errors are)."""


@cache
def _scalar_field_types(config_class: type) -> dict[str, tuple[type, bool]]:
    """`{field name: (bool | int | float, None allowed)}` for the fields of `config_class` that hold one of those."""
    hints = typing.get_type_hints(config_class)
    scalar = {}
    for field in dataclasses.fields(config_class):
        if not field.init or field.name not in hints:
            continue
        hint = hints[field.name]
        origin = typing.get_origin(hint)
        if origin is typing.Union or origin is types.UnionType:
            args = typing.get_args(hint)
        else:
            args = (hint,)
        optional = type(None) in args
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) == 1 and kinds[0] in _NUMERIC:
            scalar[field.name] = (kinds[0], optional)
    return scalar


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def coerce_value(name: str, kind: type, optional: bool, value: Any) -> Any:
    """`value` for the field `name` of type `kind` (`bool`, `int` or `float`), converted from a string as TRL's parser
    would, or a `ConfigFieldTypeError` naming the field."""
    if value is None:
        if optional:
            return None
        raise ConfigFieldTypeError(f"{name} must be a {kind.__name__}, got None.")
    if isinstance(value, str):
        try:
            return string_to_bool(value) if kind is bool else kind(value.strip())
        except (ValueError, TypeError, Exception) as error:  # ArgumentTypeError from string_to_bool
            expected = {
                bool: "a bool (or one of the strings true/false, yes/no, t/f, y/n, 1/0)",
                int: "an int (or a string of one, e.g. '8')",
                float: "a float (or a string of one, e.g. '0.2')",
            }[kind]
            raise ConfigFieldTypeError(f"{name} must be {expected}, got {value!r}.") from error
    if kind is bool:
        if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy.bool_
            return bool(value)
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        raise ConfigFieldTypeError(f"{name} must be a bool, got {_describe(value)}.")
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise ConfigFieldTypeError(f"{name} must be {'an int' if kind is int else 'a float'}, got {_describe(value)}.")
    if kind is int:
        if isinstance(value, numbers.Integral):
            return int(value)
        raise ConfigFieldTypeError(f"{name} must be an int, got {_describe(value)}.")
    if isinstance(value, numbers.Real):
        return value if isinstance(value, (int, float)) else float(value)
    raise ConfigFieldTypeError(f"{name} must be a float, got {_describe(value)}.")


@cache
def _optional_fields(config_class: type) -> frozenset[str]:
    """The init fields of `config_class` whose type admits `None`."""
    hints = typing.get_type_hints(config_class)
    optional = set()
    for field in dataclasses.fields(config_class):
        hint = hints.get(field.name)
        if field.init and typing.get_origin(hint) in (typing.Union, types.UnionType):
            if type(None) in typing.get_args(hint):
                optional.add(field.name)
    return frozenset(optional)


def coerce_field_types(config: Any) -> None:
    """Check (and convert from strings) every `bool`/`int`/`float` field of the dataclass `config` in place; the
    string `"None"` in a field that admits `None` (what a command line such as `--ratio_anchor None` passes) is
    `None`, as YAML's `null` is."""
    for name in _optional_fields(type(config)):
        if getattr(config, name) == "None":
            setattr(config, name, None)
    for name, (kind, optional) in _scalar_field_types(type(config)).items():
        value = getattr(config, name)
        converted = coerce_value(name, kind, optional, value)
        if converted is not value:
            setattr(config, name, converted)
