"""What TRL's ``GRPOTrainer`` sets on itself, read from its source: shared by the TRL guard's tests
(``tests/trainer/test_trl_compat.py``) and the trainer parts' protocol tests (``tests/trainer/test_trainer_parts.py``)."""

from __future__ import annotations

import functools
import inspect
import re

from trl import GRPOTrainer


def assigned(source: str) -> set[str]:
    """The names a class's source assigns as ``self.NAME = ...`` (or in a tuple of them)."""
    names = set()
    for targets in re.findall(r"((?:self\.\w+\s*,\s*)*self\.\w+)\s*(?::[^=\n]+)?=(?!=)", source):
        names.update(re.findall(r"self\.(\w+)", targets))
    return names


@functools.cache
def trl_names() -> frozenset[str]:
    """Instance attributes TRL's GRPOTrainer sets (and transformers' Trainer does not). Cached: parsing the two
    classes' sources takes a quarter of a second, and a test asked for it once per name it checked (70 s)."""
    import transformers

    trainer_names = assigned(inspect.getsource(transformers.Trainer)) | set(dir(transformers.Trainer))
    return frozenset(assigned(inspect.getsource(GRPOTrainer)) - trainer_names)
