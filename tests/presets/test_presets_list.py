"""The one list of presets: every preset module is in ``PRESETS`` and every entry has its module; the package exports,
the documentation's generated tables and the lookup by name all read it."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import trl_reasoning as tr
from trl_reasoning import presets
from trl_reasoning.config import ReasoningConfig
from trl_reasoning.presets import PRESETS, Preset, preset
from trl_reasoning.presets.provenance import preset_sources
from trl_reasoning.presets.tables import PIECE_COLUMNS, preset_pieces_markdown, presets_markdown, sources_markdown
from trl_reasoning.trainer.base import ReasoningTrainer

ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = ROOT / "trl_reasoning" / "presets"


def _load_marker_blocks():
    """``scripts/marker_blocks.py``, which finds and rewrites the generated blocks (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("marker_blocks", ROOT / "scripts" / "marker_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


marker_blocks = _load_marker_blocks()


#: The modules of trl_reasoning/presets/ that are not a preset: where the presets' defaults and papers come from, and
#: the docs' generated tables.
NOT_PRESETS = {"__init__", "provenance", "tables"}


def test_every_preset_module_is_in_the_list_and_every_entry_has_its_module():
    modules = {path.stem for path in PRESETS_DIR.glob("*.py") if path.stem not in NOT_PRESETS}
    listed = [entry.name for entry in PRESETS]
    assert len(listed) == len(set(listed)), f"a preset is listed twice: {listed}"
    assert sorted(modules - set(listed)) == [], "a preset module missing from trl_reasoning.presets.PRESETS"
    assert sorted(set(listed) - modules) == [], "an entry of PRESETS without its module in trl_reasoning/presets/"


@pytest.mark.parametrize("entry", PRESETS, ids=lambda entry: entry.name)
def test_each_entry_is_the_trainer_and_config_its_module_defines(entry):
    module = importlib.import_module(f"trl_reasoning.presets.{entry.name}")
    defined = [
        value for value in vars(module).values() if inspect.isclass(value) and value.__module__ == module.__name__
    ]
    trainers = [cls for cls in defined if issubclass(cls, ReasoningTrainer)]
    configs = [cls for cls in defined if issubclass(cls, ReasoningConfig)]
    assert trainers == [entry.trainer_class] and configs == [entry.config_class]
    assert entry.trainer_class.config_class is entry.config_class
    assert entry.display_name == entry.trainer_class._name and entry.display_name != ReasoningTrainer._name
    assert re.fullmatch(r"\d{4}\.\d{4,5}", entry.paper_id), entry.paper_id
    assert entry.paper_title and entry.paper_title == entry.trainer_class._paper["title"]
    assert entry.summary.strip() and "\n" not in entry.summary and "|" not in entry.summary  # one table cell


def test_a_preset_is_frozen():
    with pytest.raises(AttributeError):
        PRESETS[0].summary = "changed"


def test_preset_looks_up_by_cli_name_and_names_the_allowed_values():
    assert preset("dr_grpo").trainer_class is tr.DrGRPOTrainer and preset("dr_grpo").display_name == "Dr. GRPO"
    for entry in PRESETS:
        assert preset(entry.name) is entry
    allowed = ", ".join(entry.name for entry in PRESETS)
    with pytest.raises(ValueError, match=re.escape(f"Unknown preset 'DAPO'. Allowed values: {allowed}.")):
        preset("DAPO")


def test_the_package_exports_every_preset():
    names = [cls.__name__ for entry in PRESETS for cls in (entry.config_class, entry.trainer_class)]
    assert sorted(presets.__all__) == sorted(["PRESETS", "Preset", "preset", *names])
    assert set(presets.__all__) <= set(tr.__all__) and len(tr.__all__) == len(set(tr.__all__))
    for entry in PRESETS:
        assert getattr(tr, entry.config_class.__name__) is entry.config_class
        assert getattr(tr, entry.trainer_class.__name__) is entry.trainer_class
    assert tr.PRESETS is PRESETS and tr.Preset is Preset and tr.preset is preset
    namespace: dict = {}
    exec("from trl_reasoning import *", namespace)
    assert {name for name in tr.__all__} <= set(namespace)


def test_the_presets_table_is_generated_from_the_list():
    path, block = marker_blocks.read_block("presets")
    assert block == presets_markdown(), f"run `python scripts/presets_table.py --write` (the block is in {path.name})"
    for entry in PRESETS:
        defaults = entry.defaults()
        row = next(line for line in block.splitlines() if line.startswith(f"| `{entry.name}` |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == f"`{entry.trainer_class.__name__}` / `{entry.config_class.__name__}`"
        assert cells[3:6] == [
            f"`{defaults[name]}`" for name in ("advantage_estimator", "policy_loss", "loss_aggregation")
        ]
        assert f"arXiv {entry.paper_id}" in cells[-1]


def test_the_sources_table_is_generated_from_the_list():
    path, block = marker_blocks.read_block("preset-sources")
    expected = sources_markdown([entry.config_class for entry in PRESETS])
    assert block == expected, f"run `python scripts/sources_table.py --write` (the block is in {path.name})"


#: The fields that name a piece: the table shows the name, not ``field=value``.
_PIECES = ("advantage_estimator", "policy_loss", "loss_aggregation", "group_selection")


def test_the_pieces_table_of_the_algorithms_page_is_generated_from_the_list():
    path, block = marker_blocks.read_block("preset-pieces")
    assert path.name == "algorithms.md"
    assert block == preset_pieces_markdown(), "run `python scripts/presets_table.py --write`"
    named = {name for piece, fields in PIECE_COLUMNS.values() for name in (piece, *fields) if name is not None}
    assert named <= set(ReasoningConfig.__dataclass_fields__), "a column names a field the config does not have"
    for entry in PRESETS:
        defaults = entry.defaults()
        row = next(line for line in block.splitlines() if line.startswith(f"| `{entry.config_class.__name__}` |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 8 and f"arXiv {entry.paper_id}" in cells[-1]
        for cell, piece in zip(cells[1:4], _PIECES[:3], strict=True):
            assert cell.startswith(f"`{defaults[piece]}`"), (entry.name, cell)
        for name, (value, _) in preset_sources(entry.config_class).items():  # each sourced default, once
            assert row.count(f"`{name}={value!r}`") == (name not in _PIECES), name
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in block.splitlines()[2:]}
    assert "`beta=0.05`" in rows["`RLOOConfig`"][3]  # KL in the reward: reward shaping
    assert "`beta=0.01`" in rows["`ReinforcePPConfig`"][0]  # KL in the return: the advantage
    assert "`beta=0.0`" in rows["`DAPOConfig`"][5] and "`dynamic`" in rows["`DAPOConfig`"][4]  # the loss's: other


def test_a_block_is_found_in_the_readme_or_docs_and_rewritten_in_place(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# title\n")
    page = tmp_path / "docs" / "algorithms.md"
    page.write_text("before\n<!-- presets:start -->\nold\n<!-- presets:end -->\nafter\n")
    assert marker_blocks.read_block("presets", tmp_path) == (page, "old\n")
    assert marker_blocks.write_block("presets", "new\n", tmp_path) == page
    assert page.read_text() == "before\n<!-- presets:start -->\nnew\n<!-- presets:end -->\nafter\n"
    with pytest.raises(ValueError, match="exactly one of README.md and docs/\\*.md; found it in none"):
        marker_blocks.read_block("preset-sources", tmp_path)
    (tmp_path / "README.md").write_text("<!-- presets:start -->\n<!-- presets:end -->\n")
    with pytest.raises(ValueError, match="found it in \\['README.md', 'docs/algorithms.md'\\]"):
        marker_blocks.read_block("presets", tmp_path)


def test_each_preset_declares_one_paper_record_from_which_trls_paper_dict_is_derived():
    for entry in PRESETS:
        paper = entry.paper
        assert entry.trainer_class._paper == {"title": paper.title, "id": paper.arxiv_id, "citation": paper.bibtex}
        assert paper.url == f"https://arxiv.org/abs/{entry.paper_id}"


def test_the_derived_bibtex_is_the_one_the_presets_wrote_by_hand():
    """The BibTeX the model card prints, as it read before the ``Paper`` records (DAPO's and RLOO's, with accents)."""
    assert preset("dapo").paper.bibtex == (
        "@article{yu2025dapo,\n"
        "    title   = {{DAPO: An Open-Source LLM Reinforcement Learning System at Scale}},\n"
        "    author  = {Qiying Yu and Zheng Zhang and Ruofei Zhu and others},\n"
        "    year    = 2025,\n"
        "    eprint  = {arXiv:2503.14476},\n"
        "}"
    )
    assert preset("rloo").paper.bibtex.splitlines()[2] == (
        "    author  = {Arash Ahmadian and Chris Cremer and Matthias Gall{\\'e} and Marzieh Fadaee and Julia Kreutzer "
        'and Olivier Pietquin and Ahmet {\\"U}st{\\"u}n and Sara Hooker},'
    )
