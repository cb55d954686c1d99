"""The generators of asynchronous rollouts are declared once (``trl_reasoning.async_generators``: name, help, run
shape, refusals), read by both the config and the trainer, and each generator module registers only its start
function (``async_rollouts.starts``) when ``trl_reasoning.async_rollouts`` is imported."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import cpu_args

import trl_reasoning.async_rollouts  # noqa: F401  (registers the generators' start functions)
from trl_reasoning.async_generators import (
    GENERATORS,
    SAMPLES_AHEAD_SHAPE,
    AheadRun,
    GeneratorDeclaration,
    RunCondition,
)
from trl_reasoning.async_rollouts.starts import (
    generator_start,
    register_generator,
    registered_generators,
    unregister_generator,
)
from trl_reasoning.config import ReasoningConfig

#: A run every generator can sample ahead.
PLAIN_RUN = AheadRun(steps_per_generation=1)


def refused(name: str, **run) -> list[str]:
    return GENERATORS.get(name).refused(dataclasses.replace(PLAIN_RUN, **run))


def test_the_registered_generators_are_the_declared_ones():
    assert registered_generators() == GENERATORS.names() == ("inline", "process", "server")


@pytest.mark.parametrize("name", ["inline", "process", "server"])
def test_every_generator_has_a_start_function_a_help_and_its_refusals(name):
    assert callable(generator_start(name)) and generator_start(name).__doc__, "a documented start function"
    declaration = GENERATORS.get(name)
    assert declaration.help and "\n" not in declaration.help
    what_trl_samples = refused(name, tools=True, rollout_func=True)
    assert bool(what_trl_samples) == declaration.samples_ahead  # what samples ahead refuses what TRL samples
    assert bool(declaration.trl_samples_where) != declaration.samples_ahead
    for condition in declaration.all_refused():
        assert condition.short in declaration.summary()  # the help says what each refusal is


def test_an_unknown_generator_is_refused_naming_the_field_and_the_known_ones():
    for lookup in (generator_start, GENERATORS.get):
        with pytest.raises(ValueError, match=r"Unknown async_generator 'thread'\. Allowed values: ") as raised:
            lookup("thread")
        assert set(re.findall(r"\w+", str(raised.value).split("Allowed values:")[1])) == set(GENERATORS.names())
    with pytest.raises(ValueError, match=r"async_generator must be 'inline', 'process' or 'server', got 'thread'"):
        ReasoningConfig(**cpu_args(), async_generator="thread")


def test_the_config_help_and_docstring_are_written_from_the_declarations():
    help_text = ReasoningConfig.__dataclass_fields__["async_generator"].metadata["help"]
    listed = re.search(r"one of (\w+(?:, \w+)*)", help_text).group(1).split(", ")
    assert tuple(listed) == GENERATORS.names()
    docstring = " ".join(ReasoningConfig.__doc__.split())
    for name in listed:
        summary = GENERATORS.get(name).summary()
        assert f"{name}: {summary}" in help_text
        assert f"{name}: {summary}" in docstring


def test_a_generator_must_be_declared_and_registers_a_function():
    with pytest.raises(ValueError, match=r"Unknown async_generator 'undeclared'\. Allowed values: inline"):
        register_generator("undeclared")
    with pytest.raises(TypeError, match="start function"):
        register_generator("inline")(object())
    with pytest.raises(ValueError, match="already registered"):
        register_generator("inline")(lambda host, model_swap: None)
    with pytest.raises(ValueError, match="already declared"):
        GENERATORS.declare("inline", GeneratorDeclaration(help="again", samples_ahead=False))


def test_the_refusals_are_the_chosen_generators():
    assert refused("inline", uses_vllm=True, tools=True) == []  # TRL samples these: no refusal
    refusal = GENERATORS.refusal("process", dataclasses.replace(PLAIN_RUN, uses_vllm=True, quantized=True))
    assert re.match(r"async_generator='process' does not support use_vllm=True .*bitsandbytes", refusal)
    assert refused("server", uses_vllm=True, vllm_mode="server", quantized=True) == []  # the server samples it
    assert GENERATORS.refusal("server", PLAIN_RUN).startswith(
        "async_generator='server' does not support use_vllm=False, vllm_mode=None"
    )


@pytest.mark.parametrize("name", ["process", "server"])
def test_a_generator_that_samples_ahead_refuses_its_run_shape_once_for_config_and_trainer(name):
    vllm = {"uses_vllm": True, "vllm_mode": "server"} if name == "server" else {}
    assert refused(name, **vllm) == []
    (lag,) = refused(name, max_staleness=0, **vllm)
    assert lag.startswith("max_staleness=0 (") and "max_staleness >= 1" in lag
    (geometry,) = refused(
        name, steps_per_generation=4, gradient_accumulation_steps=1, config_name="GSPOConfig", **vllm
    )
    assert "GSPOConfig has steps_per_generation=4, num_iterations=1 and gradient_accumulation_steps=1" in geometry
    assert GENERATORS.get(name).all_refused()[: len(SAMPLES_AHEAD_SHAPE)] == SAMPLES_AHEAD_SHAPE


def test_what_the_config_knows_is_refused_at_construction_and_the_rest_when_the_trainer_is_built():
    """The config reads the same declaration as the trainer, on the part of the run it knows."""
    run = AheadRun.of_config(ReasoningConfig(**cpu_args(), use_transformers_continuous_batching=True))
    assert run.continuous_batching and run.one_generation_per_step and not run.tools
    with pytest.raises(ValueError, match=r"async_generator='process' does not support use_transformers_continuous"):
        ReasoningConfig(
            **cpu_args(), async_rollouts=True, async_generator="process", use_transformers_continuous_batching=True
        )
    # async_rollouts=None: the trainer decides (synchronous, with a warning)
    ReasoningConfig(
        **cpu_args(), async_rollouts=None, async_generator="process", use_transformers_continuous_batching=True
    )


def test_a_new_generator_is_one_declaration_and_one_registration():
    """The walk of a new generator: declared (name, help, run shape, refusals), its start function registered; the
    config then accepts it and refuses what it declared, and the trainer asks the same declaration."""
    toy = GeneratorDeclaration(
        help="A toy generator for this test.",
        samples_ahead=True,
        refuses=(RunCondition("tools", lambda run: run.tools, "tools (the toy samples text only)"),),
    )
    GENERATORS.declare("toy", toy)
    try:

        @register_generator("toy")
        def start_toy(host, model_swap):
            """Samples nothing."""
            return lambda: None

        try:
            assert ReasoningConfig(**cpu_args(), async_generator="toy").async_generator == "toy"
            with pytest.raises(ValueError, match=r"async_generator='toy' does not support max_staleness=0"):
                ReasoningConfig(**cpu_args(), async_generator="toy", async_rollouts=True, max_staleness=0)
            assert GENERATORS.refusal("toy", dataclasses.replace(PLAIN_RUN, tools=True)) == (
                "async_generator='toy' does not support tools (the toy samples text only)."
            )
            assert generator_start("toy") is start_toy
        finally:
            unregister_generator("toy")
    finally:
        GENERATORS.undeclare("toy")
    assert "toy" not in GENERATORS and "toy" not in registered_generators()


def test_the_generators_that_sample_ahead_take_tools_and_environments_and_name_what_they_cannot():
    assert refused("process", tools=True) == []
    assert refused("process", tools=True, environments=True) == []
    served = {"uses_vllm": True, "vllm_mode": "server", "tools": True, "environments": True}
    assert refused("server", **served) == []
    assert refused("server", **served | {"tools": False, "environments": False, "processes": 2}) == []
    (refusal,) = refused("server", **served | {"processes": 2})
    assert "more than one training process" in refusal and "async_generator='inline'" in refusal
    (refusal,) = refused("server", **served | {"engine_topk": True})
    assert "DPPO's top-K" in refusal and "async_generator='inline'" in refusal


def test_inline_leaves_to_trl_the_runs_trl_samples():
    inline = GENERATORS.get("inline")
    assert inline.step_time_reason(PLAIN_RUN) is None
    reason = inline.step_time_reason(dataclasses.replace(PLAIN_RUN, uses_vllm=True, steps_per_generation=2))
    assert reason == (
        "TRL's own generation samples each batch at its step (use_vllm=True, more or less than one generation per "
        "optimizer step)"
    )
