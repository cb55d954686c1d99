"""The asynchronous generators by name (``async_generator``), as the configuration sees them: each one's help and the
checks it makes on a config that chooses it.

The generators themselves (``trl_reasoning.async_rollouts``: in-process, a worker process, TRL's vLLM server) sit on
floor 3, beside ``config.py``, and the two never import each other. ``ReasoningConfig`` builds the field's help from
these names when its class is defined and refuses an unknown name or a config its generator cannot run at
construction, so what it reads of a generator is declared here, below both; each generator module of
``async_rollouts`` registers its start function and its run checks in ``async_rollouts.generators.GENERATORS``
under a name declared here (a test keeps the two lists equal).

An entry is the generator's config check, registered by name: its docstring's first paragraph is the generator's help
(``ASYNC_GENERATORS.description``), its body the checks on a config that chooses it (run by
``ReasoningConfig``).
"""

from __future__ import annotations

from typing import Any

from .registry import Registry

#: The config field that chooses a generator.
FIELD = "async_generator"

ASYNC_GENERATORS: Registry = Registry(FIELD)


def known_generator(name: Any) -> None:
    """Refuse an ``async_generator`` that no generator is declared as, naming the field and the known ones."""
    if name not in ASYNC_GENERATORS:
        names = [repr(known) for known in ASYNC_GENERATORS.names()]
        listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"{FIELD} must be {listed}, got {name!r}.")


#: What a generator that samples ahead cannot run: it hands the trainer one batch per optimizer step.
MORE_OR_LESS_THAN_ONE_GENERATION = (
    "more or less than one generation per optimizer step (steps_per_generation * num_iterations must equal "
    "gradient_accumulation_steps)"
)


def _samples_ahead(config: Any) -> None:
    """A generator that samples ahead of the trainer needs a lag to sample in, and samples one batch per optimizer
    step. Run on the config TRL has resolved (``steps_per_generation`` set)."""
    if config.async_rollouts is not False and config.max_staleness < 1:
        raise ValueError(
            f"async_generator={config.async_generator!r} samples ahead of the trainer, which max_staleness=0 "
            "forbids: set max_staleness >= 1, or async_generator='inline'."
        )
    # async_rollouts=None leaves an unsupported run synchronous, with a warning, when the trainer is built
    steps, iterations = config.steps_per_generation, config.num_iterations
    accumulation = config.gradient_accumulation_steps
    if config.async_rollouts is True and steps is not None and steps * iterations != accumulation:
        raise ValueError(
            f"async_generator={config.async_generator!r} does not support {MORE_OR_LESS_THAN_ONE_GENERATION}: "
            f"{type(config).__name__} has steps_per_generation={steps}, num_iterations={iterations} and "
            f"gradient_accumulation_steps={accumulation}. Set steps_per_generation={accumulation} (without "
            "generation_batch_size) and num_iterations=1: the pipeline's staleness then takes the ratio off 1. Or "
            "use async_generator='inline', which samples a generation batch for any number of steps."
        )


@ASYNC_GENERATORS.register("inline")
def inline(config: Any) -> None:
    """In the training process, when the batch is needed (the same lag, no overlap in time)."""


@ASYNC_GENERATORS.register("process")
def process(config: Any) -> None:
    """A worker process that samples the next max_staleness batches while the trainer trains."""
    _samples_ahead(config)


@ASYNC_GENERATORS.register("server")
def server(config: Any) -> None:
    """TRL's vLLM server, sent the next batches ahead."""
    _samples_ahead(config)
    if config.async_rollouts is not False and (not config.use_vllm or config.vllm_mode != "server"):
        raise ValueError(
            "async_generator='server' sends the batches ahead to TRL's vLLM server: set use_vllm=True and "
            f"vllm_mode='server' (got use_vllm={config.use_vllm}, vllm_mode={config.vllm_mode!r}), or use "
            "async_generator='process' (HF generate in a worker process)."
        )


def check_generator_config(config: Any) -> None:
    """The checks of the generator ``config`` chooses (its name known: :func:`known_generator`)."""
    ASYNC_GENERATORS.get(config.async_generator)(config)


def generator_descriptions() -> str:
    """``"inline: ... process: ..."``: each declared generator with its description (the field's help lists them)."""
    return " ".join(f"{name}: {ASYNC_GENERATORS.description(name)}" for name in ASYNC_GENERATORS.names())
