"""The generated tables of the docs, each a function of the code it documents, so it cannot drift from it (a test
compares every page's block with its function; ``scripts/`` rewrites the blocks):

- :func:`variant_fields_markdown`: docs/configuration.md's variants (from the registries: their descriptions, traits
  and fields), the variants' own fields and what each trait means (from the traits dataclasses);
- :func:`presets_markdown`: the README's table of the presets (from ``PRESETS`` and the configs);
- :func:`preset_pieces_markdown`: the table of the presets in docs/algorithms.md#presets, piece by piece (from
  ``PRESETS``, the configs and the registries);
- :func:`sources_markdown`: docs/presets.md's table of every preset default and its source
  (:func:`trl_reasoning.presets.provenance.preset_default` records them).
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace
from typing import Any

from ..algorithms.group_selection import resolve_group_selection
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


#: The columns of the presets' table (docs/algorithms.md#presets) between the preset and "other": the field that
#: names the column's piece (``None``: the column has none), and the other fields whose preset defaults the column
#: shows (with every field the piece's registry declares, ``Registry.declared_fields``). A default of no column goes
#: under "other".
PIECE_COLUMNS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "advantage": ("advantage_estimator", ("scale_rewards", "normalize_advantages")),
    "objective": ("policy_loss", ("epsilon", "epsilon_high", "delta", "importance_sampling_level", "ratio_anchor")),
    "aggregation": ("loss_aggregation", ()),
    "reward shaping": (
        None,
        (
            "multi_objective_aggregation",
            "reward_weights",
            "reward_clip_range",
            "overlong_cache_length",
            "kl_in_reward",
        ),
    ),
    "group selection": (
        "group_selection",
        (
            "dynamic_sampling",
            "zero_variance_filtering",
            "positive_resampling_threshold",
            "task_reward_funcs",
            "task_pass_threshold",
        ),
    ),
}
#: The advantage estimators' traits the table names beside the estimator: what it asks of the rewards, the shape of
#: its advantages and where ``beta``'s KL goes.
SHOWN_ESTIMATOR_TRAITS = ("binary_rewards", "token_level", "kl_in_return")


def _column_of(name: str, defaults: dict[str, Any]) -> str:
    """The column of the table of docs/algorithms.md#presets that shows the preset default ``name``. ``beta`` goes
    where its KL is: the reward with ``kl_in_reward``, the advantage with a ``kl_in_return`` estimator, else the loss
    ("other")."""
    if name == "beta":
        if defaults["kl_in_reward"]:
            return "reward shaping"
        estimator = VARIANT_REGISTRIES["advantage_estimator"].traits(defaults["advantage_estimator"])
        return "advantage" if estimator.kl_in_return else "other"
    for column, (piece_field, fields) in PIECE_COLUMNS.items():
        registry = VARIANT_REGISTRIES.get(piece_field or "")
        if name in fields or (registry is not None and name in registry.declared_fields()):
            return column
    return "other"


def _piece_name(column: str, defaults: dict[str, Any]) -> str | None:
    """The variant the preset's defaults choose for ``column`` (``None`` for a column with no piece), as a cell
    entry; the advantage estimator with its traits of ``SHOWN_ESTIMATOR_TRAITS``."""
    piece_field = PIECE_COLUMNS[column][0]
    if piece_field is None:
        return None
    if piece_field == "group_selection":
        return f"`{resolve_group_selection(SimpleNamespace(**defaults))}`"
    name = defaults[piece_field]
    if piece_field != "advantage_estimator":
        return f"`{name}`"
    traits = VARIANT_REGISTRIES[piece_field].traits(name)
    shown = [f"`{trait}`" for trait in SHOWN_ESTIMATOR_TRAITS if getattr(traits, trait)]
    return f"`{name}` ({', '.join(shown)})" if shown else f"`{name}`"


def preset_pieces_markdown() -> str:
    """The table of docs/algorithms.md#presets: for each preset, the piece it chooses in every column and the
    defaults it sets for that piece (``field=value``, the sourced ones, as ``preset_default`` records them), the rest
    under "other", and its paper; from ``PRESETS``, the configs and the registries, so it cannot drift from the
    code."""
    columns = [*PIECE_COLUMNS, "other"]
    rows = [f"| preset | {' | '.join(columns)} | paper |", "|---" * (len(columns) + 2) + "|"]
    naming = {piece_field for piece_field, _ in PIECE_COLUMNS.values()}
    for entry in PRESETS:
        defaults = entry.defaults()
        cells: dict[str, list[str]] = {column: [] for column in columns}
        for column in PIECE_COLUMNS:
            piece = _piece_name(column, defaults)
            cells[column] += [piece] if piece is not None else []
        for name, (value, _) in preset_sources(entry.config_class).items():
            if name not in naming:
                cells[_column_of(name, defaults)].append(f"`{name}={value!r}`")
        text = " | ".join(", ".join(cells[column]) or "none" for column in columns)
        paper = f"[arXiv {entry.paper_id}]({entry.paper.url})"
        rows.append(f"| `{entry.config_class.__name__}` | {text} | {paper} |")
    return "\n".join(rows) + "\n"
