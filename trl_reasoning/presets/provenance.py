"""Where a preset's defaults come from: :func:`preset_default` re-declares a ``ReasoningConfig`` field with the
preset's default and records its source (the paper's section or equation, the authors' code, or TRL), and
:class:`Paper` is the paper a preset implements, from which the model card's BibTeX is derived.

Every preset module uses both: its config dataclass declares ``preset_default(...)`` fields under
``@document_sources``, and its trainer declares ``paper = Paper(...)``, from which ``ReasoningTrainer`` derives
``_paper = paper.trl_paper()`` (the dict TRL's model card reads). The tables built from them are in
:mod:`trl_reasoning.presets.tables`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Paper:
    """The arXiv paper a preset implements, written once; its BibTeX and TRL's ``_paper`` dict are derived from it.

    Attributes:
        key: the BibTeX citation key (``"yu2025dapo"``).
        title: the paper's title.
        authors: the BibTeX author list (``"A and B and others"``; LaTeX accents as BibTeX writes them).
        year: the year of the arXiv version cited.
        arxiv_id: the arXiv identifier (``"2503.14476"``).
    """

    key: str
    title: str
    authors: str
    year: int
    arxiv_id: str

    @property
    def url(self) -> str:
        """The paper's arXiv page."""
        return f"https://arxiv.org/abs/{self.arxiv_id}"

    @property
    def bibtex(self) -> str:
        """A BibTeX ``@article`` entry for the paper (the model card's "Citations")."""
        return (
            f"@article{{{self.key},\n    title   = {{{{{self.title}}}}},\n    author  = {{{self.authors}}},\n"
            f"    year    = {self.year},\n    eprint  = {{arXiv:{self.arxiv_id}}},\n}}"
        )

    def trl_paper(self) -> dict[str, str]:
        """The ``_paper`` dict TRL's trainers declare and its model card reads: ``title``, ``id`` and ``citation``."""
        return {"title": self.title, "id": self.arxiv_id, "citation": self.bibtex}
