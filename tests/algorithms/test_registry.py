"""The registry a variant declares itself in (trl_reasoning/algorithms/registry.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from trl_reasoning.algorithms.registry import Registry, VariantField, at_least, one_of, trait_field


@dataclasses.dataclass(frozen=True)
class ToyTraits:
    sequence_level: bool = trait_field("one ratio per sequence.", False)
    mode: str | None = trait_field("how fast it runs.")


def make_registry() -> Registry:
    registry = Registry("toy variant", ToyTraits)

    def needs_positive_scale(config):
        if config.toy_scale <= 0:
            raise ValueError(f"toy_scale must be > 0 with variant 'scaled', got {config.toy_scale}.")

    @registry.register(
        "scaled",
        fields=(VariantField("toy_scale", 1.0, "The scale.", parameter="scale", check=at_least(0)),),
        checks=(needs_positive_scale,),
        sequence_level=True,
        mode="fast",
    )
    def scaled(x, scale=1.0):
        """Multiplies by the scale.

        More text that is not the description."""
        return x * scale

    @registry.register("plain")
    def plain(x):
        """Returns its input."""
        return x

    return registry


def test_a_variant_hands_its_declared_fields_to_its_function_by_parameter():
    registry = make_registry()
    config = SimpleNamespace(toy_scale=3.0)
    assert registry.config_kwargs("scaled", config) == {"scale": 3.0}
    assert registry.config_kwargs("plain", config) == {}
    assert registry.declared_fields() == {"toy_scale": registry.fields("scaled")[0]}


def test_field_checks_run_for_every_config_and_variant_checks_only_for_the_chosen_one():
    registry = make_registry()
    with pytest.raises(ValueError, match=r"toy_scale must be >= 0, got -1.0\."):
        registry.check_fields(SimpleNamespace(toy_scale=-1.0))
    registry.check_fields(SimpleNamespace(toy_scale=0.0))
    registry.check_config("plain", SimpleNamespace(toy_scale=0.0))
    with pytest.raises(ValueError, match="toy_scale must be > 0 with variant 'scaled'"):
        registry.check_config("scaled", SimpleNamespace(toy_scale=0.0))
    with pytest.raises(ValueError, match="Unknown toy variant 'other'. Allowed values: scaled, plain."):
        registry.check_config("other", SimpleNamespace(toy_scale=0.0))


def test_traits_descriptions_and_parameters_are_read_back():
    registry = make_registry()
    assert registry.with_trait("sequence_level") == ("scaled",)
    assert registry.traits("scaled") == ToyTraits(sequence_level=True, mode="fast")
    assert registry.traits("plain").mode is None  # unset: the dataclass's default
    assert registry.traits("plain").sequence_level is False
    assert registry.description("scaled") == "Multiplies by the scale."
    assert registry.takes("scaled", "scale") and not registry.takes("plain", "scale")


def test_a_misspelt_trait_is_an_error_naming_it_and_the_known_ones():
    registry = make_registry()
    with pytest.raises(
        TypeError,
        match=r"toy variant 'typo': unknown trait 'sequence_levle'\. The traits of a toy "
        r"variant \(ToyTraits\): sequence_level, mode\.",
    ):
        registry.register("typo", sequence_levle=True)
    assert "typo" not in registry
    with pytest.raises(TypeError, match="toy variant registry: unknown trait 'moed'"):
        registry.with_trait("moed")
    with pytest.raises(TypeError, match="unknown trait 'mode'.* \\(NoTraits\\): none"):
        Registry("traitless variant").register("plain", mode="fast")


def test_unregister_forgets_the_fields_and_checks_too():
    registry = make_registry()
    registry.unregister("scaled")
    assert registry.declared_fields() == {}
    assert registry.names() == ("plain",)
    registry.check_fields(SimpleNamespace())  # no field left to read


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (at_least(1, integer=True), 0, r"k must be an int >= 1, got 0\."),
        (at_least(1, integer=True), True, r"k must be an int >= 1, got True\."),
        (at_least(1, integer=True), 2.5, r"k must be an int >= 1, got 2.5\."),
        (at_least(0, optional=True, note="or None"), -0.5, r"k must be >= 0 \(or None\), got -0.5\."),
        (at_least(0), None, r"k must be >= 0, got None\."),
        (one_of(("a", "b")), "c", r"Unknown k 'c'\. Allowed values: a, b\."),
    ],
)
def test_declarative_field_checks_name_the_field_and_what_is_allowed(check, value, message):
    with pytest.raises(ValueError, match=message):
        check("k", value)


def test_declarative_field_checks_accept_allowed_values():
    at_least(1, integer=True)("k", 1)
    at_least(0, optional=True)("k", None)
    one_of(("a", "b"))("k", "b")
