"""Each variant declares itself: config and trainer ask the registries, and the "one of" help texts and the docs'
field table are generated from them."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import HfArgumentParser
from trl import GRPOConfig

import trl_reasoning as tr
from trl_reasoning.algorithms.losses import DPPO_DEFAULT_THRESHOLDS, POLICY_LOSSES
from trl_reasoning.algorithms.registry import VariantField
from trl_reasoning.async_generators import GENERATORS
from trl_reasoning.config import (
    _SCALE_REWARDS_TO_ESTIMATOR,
    _TRL_LOSS_TYPES,
    VARIANT_FIELDS,
    VARIANT_REGISTRIES,
    ReasoningConfig,
)
from trl_reasoning.presets.tables import FIELD_TABLE_MARKERS, variant_fields_markdown
from trl_reasoning.trainer.base import ReasoningTrainer

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "trl_reasoning"


def cpu_args(**kwargs):
    return {"output_dir": "/tmp/trl-reasoning-variants", "use_cpu": True, "report_to": "none", **kwargs}


def registered_names() -> set[str]:
    return {name for registry in VARIANT_REGISTRIES.values() for name in registry.names()}


def variant_name_comparisons(source: str, names: set[str]) -> list[str]:
    """``Compare`` nodes of ``source`` whose operands are (or hold, in a tuple, list or set) a string in ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in operands:
            constants = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            hits = [c.value for c in constants if isinstance(c, ast.Constant) and c.value in names]
            if hits:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_the_name_comparison_finder_finds_them():
    names = {"dppo", "clip", "gspo"}
    source = 'a = x.policy_loss == "dppo"\nb = y in ("clip", "gspo")\nc = {"gspo"} != z\nd = x == "token"\n'
    assert len(variant_name_comparisons(source, names)) == 3


@pytest.mark.parametrize(
    "path",
    [PACKAGE / "config.py", *sorted((PACKAGE / "trainer").rglob("*.py"))],
    ids=lambda path: str(path.relative_to(PACKAGE)),
)
def test_config_and_trainer_compare_no_variant_name(path):
    """They ask the registry (declared fields, checks, traits) instead of branching on a variant's name."""
    assert variant_name_comparisons(path.read_text(), registered_names()) == []


#: Every field whose help says "one of ...", with the names it must list, exactly and in order.
ONE_OF_FIELDS = {
    **{field_name: registry.names() for field_name, registry in VARIANT_REGISTRIES.items()},
    "loss_type": tuple(_TRL_LOSS_TYPES),
    "scale_rewards": tuple(_SCALE_REWARDS_TO_ESTIMATOR),
    "dppo_divergence": tuple(DPPO_DEFAULT_THRESHOLDS),
    "async_generator": GENERATORS.names(),
}


def listed_names(help_text: str) -> tuple[str, ...]:
    match = re.search(r"one of (\w+(?:, \w+)*)", help_text)
    assert match, f"no 'one of' list in {help_text!r}"
    return tuple(name.strip() for name in match.group(1).split(","))


def own_help_texts(config_cls) -> dict[str, str]:
    """The help texts trl-reasoning writes (fields TRL lacks, or re-declared with another help)."""
    trl_help = {f.name: f.metadata.get("help") for f in dataclasses.fields(GRPOConfig)}
    return {
        f.name: f.metadata.get("help", "")
        for f in dataclasses.fields(config_cls)
        if trl_help.get(f.name) != f.metadata.get("help")
    }


@pytest.mark.parametrize("config_cls", [ReasoningConfig, tr.DAPOConfig, tr.DPPOConfig, tr.MaxRLConfig])
def test_every_one_of_help_lists_exactly_the_registered_names(config_cls):
    helps = own_help_texts(config_cls)
    with_lists = {name for name, text in helps.items() if "one of" in text.lower()}
    assert with_lists == set(ONE_OF_FIELDS), "a 'one of' help text that no registry generates"
    for field_name, names in ONE_OF_FIELDS.items():
        assert listed_names(helps[field_name]) == tuple(names), field_name


def test_the_cli_help_lists_every_policy_loss():
    """``--help`` is built from the field metadata: it lists all seven losses (it listed five by hand)."""
    parser = HfArgumentParser(tr.DAPOConfig)
    actions = {action.dest: action for action in parser._actions}
    assert listed_names(actions["policy_loss"].help) == POLICY_LOSSES.names()
    assert len(POLICY_LOSSES.names()) >= 7


def test_the_docs_field_table_is_generated_from_the_registries():
    start, end = FIELD_TABLE_MARKERS
    pages = [path for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if start in path.read_text()]
    assert len(pages) == 1, f"one page holds the {start.strip()} block, found {pages}"
    block = pages[0].read_text().split(start)[1].split(end)[0]
    assert block == variant_fields_markdown(), "run `python scripts/config_fields_table.py` to regenerate it"


def test_every_declared_field_is_a_config_field_with_its_declared_default():
    config_fields = ReasoningConfig.__dataclass_fields__
    trl_fields = GRPOConfig.__dataclass_fields__
    assert VARIANT_FIELDS, "no variant declares a field"
    for name, declared in VARIANT_FIELDS.items():
        assert name in config_fields, name
        assert config_fields[name].default == declared.default, name
        assert (name in trl_fields) == declared.defined_by_trl, name
        if not declared.defined_by_trl:
            assert config_fields[name].metadata["help"] == declared.help, name


def test_every_declared_parameter_is_a_parameter_of_its_function():
    for registry in VARIANT_REGISTRIES.values():
        for name in registry.names():
            for declared in registry.fields(name):
                if declared.parameter is not None:
                    assert registry.takes(name, declared.parameter), (name, declared.parameter)


@pytest.mark.parametrize(
    ("config_cls", "kwargs", "expected"),
    [
        (
            tr.DPPOConfig,
            {"dppo_divergence": "binary_kl", "dppo_threshold": 0.07, "dppo_is_cap": 3.0},
            {"divergence": "binary_kl", "threshold": 0.07, "is_cap": 3.0},
        ),
        (
            ReasoningConfig,
            {"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0},
            {"sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0},
        ),
        (
            ReasoningConfig,
            {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_neg": 4.0},
            {"vespo_k_pos": 1.5, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 4.0},
        ),
    ],
)
def test_a_losss_declared_fields_reach_it(config_cls, kwargs, expected):
    config = config_cls(**cpu_args(**kwargs))
    host = SimpleNamespace(args=config, epsilon_low=0.2, epsilon_high=0.28)
    offered = ReasoningTrainer._policy_loss_kwargs(host, {})
    assert {key: offered[key] for key in expected} == expected
    other_fields = {f.parameter for loss in POLICY_LOSSES.names() for f in POLICY_LOSSES.fields(loss)}
    own = {f.parameter for f in POLICY_LOSSES.fields(config.policy_loss)}
    assert not (other_fields - own) & set(offered), "another loss's field reached this one"


def test_a_registered_loss_declares_its_fields_checks_and_traits_and_config_obeys():
    """A loss registered outside the package: ReasoningConfig runs its declared field check on every config and its
    own check when it is chosen, and reads its traits, without knowing its name."""

    def check_toy(config):
        if config.beta != 0.0:
            raise ValueError("policy_loss='toy' needs beta=0.0")

    toy_field = VariantField("dppo_topk", 20, "K", parameter="topk")  # routes an existing field to a new loss

    @POLICY_LOSSES.register("toy", fields=(toy_field,), checks=(check_toy,), sequence_level=True)
    def toy_loss(logps, old_logps, advantages, mask, topk=20, stats=None):
        """A test loss."""
        return -advantages * logps

    try:
        with pytest.raises(ValueError, match="policy_loss='toy' needs beta=0.0"):
            ReasoningConfig(**cpu_args(policy_loss="toy", beta=0.1))
        config = ReasoningConfig(**cpu_args(policy_loss="toy", beta=0.0, importance_sampling_level="sequence"))
        assert POLICY_LOSSES.config_kwargs("toy", config) == {"topk": 20}
        ReasoningConfig(**cpu_args(policy_loss="clip", beta=0.1))  # another loss: the toy's check does not run
    finally:
        POLICY_LOSSES.unregister("toy")
    assert "toy" not in POLICY_LOSSES


def test_a_declared_field_check_runs_whichever_variant_is_chosen():
    with pytest.raises(ValueError, match=r"dppo_threshold must be >= 0 \(or None for the paper default\), got -1.0"):
        ReasoningConfig(**cpu_args(policy_loss="clip", dppo_threshold=-1.0))


def test_every_trait_is_a_field_of_its_registrys_traits_dataclass_with_a_one_line_help():
    for registry in VARIANT_REGISTRIES.values():
        assert dataclasses.is_dataclass(registry.traits_class) and registry.traits_class.__dataclass_params__.frozen
        for trait in dataclasses.fields(registry.traits_class):
            help_text = trait.metadata.get("help", "")
            assert help_text.strip() and "\n" not in help_text, (registry.kind, trait.name)
        for name in registry.names():
            assert isinstance(registry.traits(name), registry.traits_class), (registry.kind, name)


def test_a_misspelt_trait_fails_at_registration_naming_it():
    with pytest.raises(TypeError, match=r"policy loss 'toy': unknown trait 'sequence_levle'\. .*sequence_level"):

        @POLICY_LOSSES.register("toy", sequence_levle=True)
        def toy_loss(logps, old_logps, advantages, mask):
            return -advantages * logps

    assert "toy" not in POLICY_LOSSES


def test_the_docs_traits_column_is_generated_from_the_traits_dataclasses():
    from trl_reasoning.presets.tables import traits_cell

    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = {}
    for line in page.split(FIELD_TABLE_MARKERS[0])[1].split(FIELD_TABLE_MARKERS[1])[0].splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[2]
    assert traits_cell(POLICY_LOSSES, "clip") == (
        "`anchors=pi_old/sampler/decoupled`, `async_anchor=decoupled`, `sequence_level`"
    )
    for registry in VARIANT_REGISTRIES.values():
        for name in registry.names():
            assert rows[name] == traits_cell(registry, name), name
    for registry in VARIANT_REGISTRIES.values():  # and what each trait means, from its field's help
        for trait in dataclasses.fields(registry.traits_class):
            assert f"| `{trait.name}` |" in page, trait.name


def test_each_variant_field_s_docstring_entry_is_its_declared_help():
    """The config's docstring entry of every variant field trl-reasoning declares is written from the declaration
    (``VariantField.help`` and default), so the meaning is written once."""
    import textwrap

    from trl_reasoning.config import VARIANT_FIELDS, ReasoningConfig

    doc = ReasoningConfig.__doc__
    assert "{variant field" not in doc
    own = [declared for declared in VARIANT_FIELDS.values() if not declared.defined_by_trl]
    assert len(own) >= 7
    for declared in own:
        entry = doc.split(f"\n        {declared.name} (", 1)[1].split("\n        ", 1)[0]
        assert f"defaults to `{declared.default!r}`".replace("'", '"') in entry.splitlines()[0], declared.name
        body = " ".join(line.strip() for line in doc.split(f"\n        {declared.name} (", 1)[1].splitlines()[1:4])
        assert " ".join(textwrap.wrap(declared.help))[:60] in body, declared.name
