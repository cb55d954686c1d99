"""Where a preset's defaults come from: :func:`preset_default` re-declares a ``ReasoningConfig`` field with the
preset's default and records its source (the paper's section or equation, the authors' code, or TRL); :func:`bibtex`
writes the model card's citation of the preset's paper.

Every preset module's config dataclass declares ``preset_default(...)`` fields under ``@document_sources``. The
tables built from them are in :mod:`trl_reasoning.presets.tables`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from ..config import ReasoningConfig

#: Where each preset default comes from, per dataclass field object. Not kept in the field's metadata: transformers'
#: HfArgumentParser passes every metadata entry to argparse. The metadata's help text gets the source appended, so
#: ``trl-reasoning dapo --help`` shows it.
_SOURCES: dict[dataclasses.Field, str] = {}


def preset_default(name: str, value: Any, *, source: str):
    """A dataclass field that re-declares ``ReasoningConfig.name`` with a preset's default, keeping its help text and
    recording where the value comes from (``source``: the paper's section or equation, the authors' code file, or
    TRL), which :func:`preset_sources`, the preset's docstring, ``--help`` and the table of docs/presets.md show."""
    parent = ReasoningConfig.__dataclass_fields__[name]
    if not source.strip():
        raise ValueError(f"preset_default({name!r}): every preset default needs a source")
    metadata = dict(parent.metadata)
    metadata["help"] = f"{metadata.get('help', '').rstrip()} Preset default from: {source}.".strip()
    preset_field = field(default=value, metadata=metadata)
    _SOURCES[preset_field] = source
    return preset_field


def preset_sources(config_class: type[ReasoningConfig]) -> dict[str, tuple[Any, str]]:
    """``{field: (default, source)}`` for every default a preset sets with :func:`preset_default`, in field order."""
    return {f.name: (f.default, _SOURCES[f]) for f in dataclasses.fields(config_class) if f in _SOURCES}


def document_sources(config_class: type[ReasoningConfig]) -> type[ReasoningConfig]:
    """Class decorator: append each default and its source to the preset's docstring (``help(DAPOConfig)``)."""
    lines = [f"    - `{name}={value!r}`: {source}" for name, (value, source) in preset_sources(config_class).items()]
    config_class.__doc__ = (
        (config_class.__doc__ or "").rstrip()
        + "\n\n    Defaults and where they come from:\n\n"
        + "\n".join(lines)
        + "\n"
    )
    return config_class


def bibtex(key: str, title: str, authors: str, year: int, arxiv_id: str) -> str:
    """A BibTeX ``@article`` entry for an arXiv paper (used by the model card)."""
    return (
        f"@article{{{key},\n    title   = {{{{{title}}}}},\n    author  = {{{authors}}},\n"
        f"    year    = {year},\n    eprint  = {{arXiv:{arxiv_id}}},\n}}"
    )
