"""Fields of a dataclass config set after it was built (``args.beta = 0.0``), checked again as construction checks
them.

A config resolves and checks its fields in ``__post_init__``; a field assigned afterwards skips both, so a typo or a
combination construction refuses would reach training unchecked. :func:`remember_construction` keeps, on the config,
the arguments it was built with and the values it resolved; :func:`changed_fields` compares the present values with
those; :func:`rebuild_with_changes` builds the config again from its arguments with the changed values (construction's
own checks, with its own messages, naming the field) and takes over what the rebuilt config resolved. Knows
dataclasses, nothing of RL.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Where a config keeps its construction arguments and the values last checked.
CONSTRUCTION_ATTRIBUTE = "_trl_reasoning_construction"


def field_values(config: Any) -> dict[str, Any]:
    """The values of ``config``'s init fields."""
    return {item.name: getattr(config, item.name) for item in dataclasses.fields(config) if item.init}


def remember_construction(config: Any, arguments: dict[str, Any]) -> None:
    """Keep ``arguments`` (the init fields as given, before ``__post_init__``) and the values now resolved."""
    object.__setattr__(config, CONSTRUCTION_ATTRIBUTE, (arguments, field_values(config)))


def mark_checked(config: Any) -> None:
    """Take the present values as checked (what a trainer resolves itself is no user change)."""
    construction = getattr(config, CONSTRUCTION_ATTRIBUTE, None)
    if construction is not None:
        object.__setattr__(config, CONSTRUCTION_ATTRIBUTE, (construction[0], field_values(config)))


def _same(value: Any, checked: Any) -> bool:
    try:
        return type(value) is type(checked) and bool(value == checked)
    except Exception:  # noqa: BLE001 - a value without a plain equality (an array) is unchanged only if it is the same
        return value is checked


def changed_fields(config: Any) -> list[str]:
    """The fields set since ``config`` was built or last checked (none for a config that kept no construction)."""
    construction = getattr(config, CONSTRUCTION_ATTRIBUTE, None)
    if construction is None:
        return []
    checked = construction[1]
    return [name for name, value in field_values(config).items() if not _same(value, checked.get(name))]


def rebuild_with_changes(config: Any) -> list[str]:
    """Build ``config`` again from its construction arguments with its changed values, and take over the rebuilt
    config's state; the changed fields' names. A value construction refuses raises its error, prefixed with the
    changed fields (``beta=0.0 (set after ProRLConfig was built): ...``)."""
    changed = changed_fields(config)
    if not changed:
        return []
    arguments = getattr(config, CONSTRUCTION_ATTRIBUTE)[0]
    updates = {name: getattr(config, name) for name in changed}
    try:
        rebuilt = type(config)(**{**arguments, **updates})
    except (ValueError, TypeError) as error:
        set_after = ", ".join(f"{name}={value!r}" for name, value in updates.items())
        raise type(error)(f"{set_after} (set after {type(config).__name__} was built): {error}") from error
    config.__dict__.update(rebuilt.__dict__)
    return changed
