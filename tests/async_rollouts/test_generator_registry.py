"""The generators of asynchronous rollouts are declared by name: ``ReasoningConfig`` reads their names, help and config
checks one floor down (``algorithms.async_generators``), and each generator module registers its start function and
run checks in ``async_rollouts.generators.GENERATORS`` when ``trl_reasoning.async_rollouts`` is imported."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import cpu_args

import trl_reasoning.async_rollouts  # noqa: F401  (registers the generators)
from trl_reasoning.algorithms.async_generators import ASYNC_GENERATORS
from trl_reasoning.async_rollouts.checks import check_ahead_generator
from trl_reasoning.async_rollouts.generators import (
    GENERATORS,
    AheadRun,
    GeneratorBackend,
    generator_backend,
    generator_help,
    register_generator,
)
from trl_reasoning.config import ReasoningConfig

#: A run every generator can sample ahead.
PLAIN_RUN = AheadRun(
    uses_vllm=False,
    vllm_mode=None,
    tools=False,
    vision_language=False,
    one_generation_per_step=True,
    quantized=False,
)


def test_the_registered_generators_are_the_declared_ones():
    assert set(GENERATORS.names()) == set(ASYNC_GENERATORS.names()) == {"inline", "process", "server"}
    assert len(GENERATORS.names()) == len(ASYNC_GENERATORS.names())


@pytest.mark.parametrize("name", ["inline", "process", "server"])
def test_every_generator_has_a_start_function_checks_and_help(name):
    backend = generator_backend(name)
    assert isinstance(backend, type) and issubclass(backend, GeneratorBackend)
    assert backend.start is not GeneratorBackend.start, "it overrides start"
    assert backend.__doc__ and backend.__doc__ is not GeneratorBackend.__doc__, "its own docstring"
    refused = backend.unsupported(dataclasses.replace(PLAIN_RUN, tools=True, rollout_func=True))
    assert isinstance(refused, list) and all(isinstance(what, str) for what in refused)
    assert bool(refused) == backend.samples_ahead_with_snapshots  # what samples ahead refuses what TRL samples
    assert callable(ASYNC_GENERATORS.get(name)), "its config checks"
    assert generator_help(name) and "\n" not in generator_help(name)


def test_an_unknown_generator_is_refused_naming_the_field_and_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown async_generator 'thread'\. Allowed values: ") as raised:
        generator_backend("thread")
    assert set(re.findall(r"\w+", str(raised.value).split("Allowed values:")[1])) == set(GENERATORS.names())
    with pytest.raises(ValueError, match=r"async_generator must be 'inline', 'process' or 'server', got 'thread'"):
        ReasoningConfig(**cpu_args(), async_generator="thread")


def test_the_config_help_lists_exactly_the_registered_generators():
    help_text = ReasoningConfig.__dataclass_fields__["async_generator"].metadata["help"]
    listed = re.search(r"one of (\w+(?:, \w+)*)", help_text).group(1).split(", ")
    assert tuple(listed) == ASYNC_GENERATORS.names()
    assert set(listed) == set(GENERATORS.names())
    for name in listed:
        assert f"{name}: {generator_help(name)}" in help_text


def test_a_generator_must_be_declared_and_a_backend():
    with pytest.raises(ValueError, match=r"Unknown async_generator 'undeclared'\. Allowed values: inline"):
        register_generator("undeclared")
    with pytest.raises(TypeError, match="GeneratorBackend subclass"):
        register_generator("inline")(lambda rollouts: None)


def test_the_run_checks_are_the_chosen_generators():
    check_ahead_generator("inline", **vars(PLAIN_RUN) | {"uses_vllm": True, "tools": True})  # TRL samples: no refusal
    flags = vars(PLAIN_RUN) | {"uses_vllm": True, "quantized": True}
    with pytest.raises(ValueError, match=r"async_generator='process' does not support use_vllm=True .*bitsandbytes"):
        check_ahead_generator("process", **flags)
    check_ahead_generator("server", **flags | {"vllm_mode": "server"})  # the server samples a quantized model
    with pytest.raises(ValueError, match=r"async_generator='server' does not support use_vllm=False"):
        check_ahead_generator("server", **vars(PLAIN_RUN))


def test_a_new_generator_is_one_declaration_and_one_registration():
    """The walk of a new generator: declared (name, help, config checks), registered (start, run checks); the config
    then accepts it and runs its checks, and the run asks it what it cannot sample."""

    @ASYNC_GENERATORS.register("toy")
    def toy(config) -> None:
        """A toy generator for this test."""
        if config.max_staleness > 3:
            raise ValueError("async_generator='toy' needs max_staleness <= 3")

    try:

        @register_generator("toy")
        class ToyGenerator(GeneratorBackend):
            """Samples nothing."""

            @staticmethod
            def start(host, model_swap):
                return lambda: None

            @staticmethod
            def unsupported(run: AheadRun) -> list[str]:
                return ["tools"] if run.tools else []

        try:
            assert ReasoningConfig(**cpu_args(), async_generator="toy").async_generator == "toy"
            with pytest.raises(ValueError, match="needs max_staleness <= 3"):
                ReasoningConfig(**cpu_args(), async_generator="toy", max_staleness=4)
            with pytest.raises(ValueError, match="async_generator='toy' does not support tools"):
                check_ahead_generator("toy", **vars(PLAIN_RUN) | {"tools": True})
        finally:
            GENERATORS.unregister("toy")
    finally:
        ASYNC_GENERATORS.unregister("toy")
    assert "toy" not in GENERATORS and "toy" not in ASYNC_GENERATORS


def test_the_generators_that_sample_ahead_take_tools_and_environments_and_name_what_they_cannot():
    tools = dataclasses.replace(PLAIN_RUN, tools=True)
    environments = dataclasses.replace(tools, environments=True)
    assert generator_backend("process").unsupported(tools) == []
    assert generator_backend("process").unsupported(environments) == []
    served = dataclasses.replace(environments, uses_vllm=True, vllm_mode="server")
    server = generator_backend("server")
    assert server.unsupported(served) == []
    assert server.unsupported(dataclasses.replace(served, tools=False, environments=False, processes=2)) == []
    (refused,) = server.unsupported(dataclasses.replace(served, processes=2))
    assert "more than one training process" in refused and "async_generator='inline'" in refused
    (refused,) = server.unsupported(dataclasses.replace(served, engine_topk=True))
    assert "DPPO's top-K" in refused and "async_generator='inline'" in refused
