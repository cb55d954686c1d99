"""The generated tables of the docs, each a function of the code it documents, so it cannot drift from it (a test
compares every page's block with its function; ``scripts/`` rewrites the blocks):

- :func:`variant_fields_markdown`: docs/configuration.md's variants (from the registries: their descriptions, traits
  and fields), the variants' own fields and what each trait means (from the traits dataclasses);
- :func:`presets_markdown`: the README's table of the presets (from ``PRESETS`` and the configs);
- :func:`sources_markdown`: docs/presets.md's table of every preset default and its source
  (:func:`trl_reasoning.presets.provenance.preset_default` records them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..algorithms.registry import Registry
from ..config import VARIANT_FIELDS, VARIANT_REGISTRIES, ReasoningConfig
from . import PRESETS
from .provenance import preset_sources

#: The markers of the generated field table in docs/configuration.md (``variant_fields_markdown``).
FIELD_TABLE_MARKERS = ("<!-- config-fields:start -->\n", "<!-- config-fields:end -->")


def _table_cell(text: str) -> str:
    """``text`` as one Markdown table cell: reStructuredText's roles and double backticks as code, pipes escaped."""
    return re.sub(r":\w+:`", "`", text).replace("``", "`").replace("|", "\\|")


def trait_cell_entry(key: str, value: Any) -> str | None:
    """One trait as the traits column shows it: ``key=value`` for a text (or a tuple of texts, joined by ``/``), the
    name alone for another true value, nothing (``None``) for an unset one (``None``, ``False``)."""
    if isinstance(value, str):
        return f"`{key}={value}`"
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        return f"`{key}={'/'.join(value)}`"
    return f"`{key}`" if value else None


def traits_cell(registry: Registry, name: str) -> str:
    """The traits column of ``name``'s row: the fields of its traits dataclass that it sets, by name."""
    traits = registry.traits(name)
    entries = (trait_cell_entry(f.name, getattr(traits, f.name)) for f in dataclasses.fields(traits))
    return ", ".join(sorted(entry for entry in entries if entry is not None))


def traits_markdown() -> str:
    """The table of every trait a variant can be registered with: its field, its traits dataclass and its meaning
    (the field's ``help``)."""
    lines = ["| trait | of | meaning |", "|---|---|---|"]
    for field_name, registry in VARIANT_REGISTRIES.items():
        for trait in dataclasses.fields(registry.traits_class):
            of = f"{field_name} (`{registry.traits_class.__name__}`)"
            lines.append(f"| `{trait.name}` | {of} | {_table_cell(trait.metadata['help'])} |")
    return "\n".join(lines) + "\n"


def variant_fields_markdown() -> str:
    """The table of docs/configuration.md: each field that chooses a variant, its registered values (the first
    paragraph of each one's docstring, its traits, the fields it declares), every declared field's default, then what
    each trait means."""
    lines: list[str] = []
    for field_name, registry in VARIANT_REGISTRIES.items():
        lines += [f"#### `{field_name}` ({registry.kind})", ""]
        lines += ["| value | what it is | traits | its fields |", "|---|---|---|---|"]
        for name in registry.names():
            own = ", ".join(f"`{declared.name}`" for declared in registry.fields(name))
            description = _table_cell(registry.description(name))
            lines.append(f"| `{name}` | {description} | {traits_cell(registry, name)} | {own} |")
        lines.append("")
    lines += ["#### The variants' own fields", "", "| field | default | read by | meaning |", "|---|---|---|---|"]
    for field_name, declared in VARIANT_FIELDS.items():
        default = ReasoningConfig.__dataclass_fields__[field_name].default
        readers = [
            f"{chooser}=`{name}`"
            for chooser, registry in VARIANT_REGISTRIES.items()
            for name in registry.names()
            if declared in registry.fields(name)
        ]
        owner = " (TRL's field)" if declared.defined_by_trl else ""
        row = f"| `{field_name}` | `{default!r}` | {', '.join(readers)} | {_table_cell(declared.help)}{owner} |"
        lines.append(row)
    lines += ["", "#### The traits", "", traits_markdown().rstrip("\n")]
    return "\n".join(lines) + "\n"


def sources_markdown(config_classes: list[type[ReasoningConfig]]) -> str:
    """The table of every preset's defaults and their sources (docs/presets.md, "Where each default comes from")."""
    rows = ["| preset | default | source |", "|---|---|---|"]
    for config_class in config_classes:
        for name, (value, source) in preset_sources(config_class).items():
            rows.append(f"| `{config_class.__name__}` | `{name}={value!r}` | {source} |")
    return "\n".join(rows) + "\n"


#: The three pieces every preset names, the first columns of the table (the rest of its sourced defaults follow).
_PIECES = ("advantage_estimator", "policy_loss", "loss_aggregation")


def presets_markdown() -> str:
    """The README's table of the presets: each one's pieces and the other defaults it sets (the sourced ones, as
    ``preset_default`` records them), from ``PRESETS`` and the configs, so it cannot drift from the code."""
    rows = [
        "| preset | trainer / config | in short | advantage | objective | aggregation | other defaults | paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in PRESETS:
        defaults = entry.defaults()
        sourced = preset_sources(entry.config_class).items()
        others = [f"`{name}={value!r}`" for name, (value, _) in sourced if name not in _PIECES]
        pieces = " | ".join(f"`{defaults[piece]}`" for piece in _PIECES)
        rows.append(
            f"| `{entry.name}` | `{entry.trainer_class.__name__}` / `{entry.config_class.__name__}` | {entry.summary} "
            f"| {pieces} | {', '.join(others)} | [arXiv {entry.paper_id}](https://arxiv.org/abs/{entry.paper_id}) |"
        )
    return "\n".join(rows) + "\n"
