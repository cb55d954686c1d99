"""What TRL's model card reads of a preset trainer (``_tag_names``, ``_name``, ``_paper``): ``ReasoningTrainer``'s
``__init_subclass__`` derives the tags and the paper dict from the preset's ``_tag`` and ``paper``, and they are the
values each preset once wrote by hand."""

from __future__ import annotations

import pytest

from trl_reasoning import DAPOTrainer, ReasoningConfig, ReasoningTrainer
from trl_reasoning.presets import PRESETS, preset
from trl_reasoning.presets.provenance import Paper

#: Each preset's ``(_tag_names[-1], _name, arXiv id)`` as its module wrote them before they were derived.
WRITTEN_BY_HAND = {
    "dapo": ("dapo", "DAPO", "2503.14476"),
    "cispo": ("cispo", "CISPO", "2506.13585"),
    "gspo": ("gspo", "GSPO", "2507.18071"),
    "prorl": ("prorl", "ProRL", "2505.24864"),
    "dppo": ("dppo", "DPPO", "2602.04879"),
    "maxrl": ("maxrl", "MaxRL", "2602.02710"),
    "rloo": ("rloo", "RLOO", "2402.14740"),
    "reinforce_pp": ("reinforce-pp", "REINFORCE++", "2501.03262"),
    "dr_grpo": ("dr-grpo", "Dr. GRPO", "2503.20783"),
    "scalerl": ("scalerl", "ScaleRL", "2510.13786"),
}


@pytest.mark.parametrize("entry", PRESETS, ids=lambda entry: entry.name)
def test_every_preset_trainer_derives_its_tags_and_paper(entry):
    """A new preset needs no line here: whatever its ``_tag`` and ``paper``, the card reads them."""
    trainer = entry.trainer_class
    assert trainer._tag_names == ["trl", "trl-reasoning", trainer._tag]
    assert trainer._paper == trainer.paper.trl_paper()
    assert trainer._paper == {
        "title": trainer.paper.title,
        "id": trainer.paper.arxiv_id,
        "citation": trainer.paper.bibtex,
    }


@pytest.mark.parametrize("name", WRITTEN_BY_HAND)
def test_the_derived_names_are_those_written_by_hand(name):
    tag, display_name, arxiv_id = WRITTEN_BY_HAND[name]
    trainer = preset(name).trainer_class
    assert trainer._tag_names == ["trl", "trl-reasoning", tag]
    assert trainer._name == display_name
    assert trainer.paper.arxiv_id == arxiv_id


def test_the_base_trainer_keeps_its_own_and_trls_paper():
    """``ReasoningTrainer`` itself declares no paper: its card cites GRPO's, as TRL's ``GRPOTrainer`` does."""
    from trl import GRPOTrainer

    assert ReasoningTrainer._tag_names == ["trl", "trl-reasoning"] and ReasoningTrainer._name == "trl-reasoning"
    assert ReasoningTrainer._paper is GRPOTrainer._paper


def test_a_users_subclass_of_a_preset_keeps_the_presets_card():
    class MyDAPO(DAPOTrainer):
        pass

    assert MyDAPO._tag_names == ["trl", "trl-reasoning", "dapo"]
    assert MyDAPO._name == "DAPO" and MyDAPO.paper is DAPOTrainer.paper
    assert MyDAPO._paper == DAPOTrainer._paper == preset("dapo").paper.trl_paper()


def test_a_subclass_with_its_own_tag_and_paper_gets_them_unless_it_writes_the_derived_attributes():
    mine = Paper(key="me2026", title="Mine", authors="Me", year=2026, arxiv_id="2601.00001")

    class Mine(DAPOTrainer):
        config_class = ReasoningConfig
        _name = "Mine"
        _tag = "mine"
        paper = mine

    assert Mine._tag_names == ["trl", "trl-reasoning", "mine"]
    assert Mine._paper == mine.trl_paper() and Mine._name == "Mine"
    assert DAPOTrainer._tag_names == ["trl", "trl-reasoning", "dapo"]  # the parent's are untouched

    class Written(ReasoningTrainer):
        _tag = "ignored"
        _tag_names = ["trl", "custom"]
        paper = mine
        _paper = {"title": "by hand"}

    assert Written._tag_names == ["trl", "custom"] and Written._paper == {"title": "by hand"}
