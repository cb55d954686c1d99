"""Floor 2, the asynchronous generators as declarations (``async_generator``): each generator's name, its help, its
run shape and what of a run it cannot sample, written once.

Two floors read them: ``ReasoningConfig`` (the field's help and docstring entry, the refusals it can judge at
construction) and ``trl_reasoning.async_rollouts`` (the same refusals when a trainer is built, whether a run keeps
snapshots, and the start function each generator module registers under a declared name). The declarations are
data, not code paths: a refusal is a :class:`RunCondition`, a predicate on an :class:`AheadRun` with the words that
name it, so the error, the ``--help`` text and the docstring all come from it. This module imports nothing of the
package, and neither torch nor TRL.

Adding a generator: declare it here (``GENERATORS.declare``), then register its start function in its own module of
``async_rollouts/`` (``register_generator``) and import that module in ``async_rollouts/__init__.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The config field that chooses a generator, and its default.
FIELD = "async_generator"
DEFAULT = "inline"


@dataclass(frozen=True)
class AheadRun:
    """A run as the generators' rules read it.

    The config knows the fields down to ``continuous_batching`` at construction; the trainer knows the rest when it is
    built (their defaults say "absent"), so a rule on them first applies then. ``steps_per_generation=None``: not
    resolved yet (TRL resolves it in ``GRPOConfig.__post_init__``).
    """

    config_name: str = "ReasoningConfig"
    max_staleness: int = 1
    steps_per_generation: int | None = None
    num_iterations: int = 1
    gradient_accumulation_steps: int = 1
    uses_vllm: bool = False
    vllm_mode: str | None = None
    continuous_batching: bool = False  # transformers' continuous batching (``use_transformers_paged`` too)
    tools: bool = False  # tools or an ``environment_factory``
    environments: bool = False  # an ``environment_factory`` (``tools`` is True with it too)
    vision_language: bool = False
    quantized: bool = False  # bitsandbytes 4- or 8-bit
    rollout_func: bool = False
    processes: int = 1  # training processes
    engine_topk: bool = False  # DPPO's top-K divergence read from the vLLM engine's own top-K

    @property
    def one_generation_per_step(self) -> bool:
        """One generation batch per optimizer step (``steps_per_generation * num_iterations ==
        gradient_accumulation_steps``, TRL's default); true while the geometry is unresolved."""
        steps = self.steps_per_generation
        return steps is None or steps * self.num_iterations == self.gradient_accumulation_steps

    @classmethod
    def of_config(cls, config: Any) -> AheadRun:
        """What ``config`` alone says of its run (the trainer's part keeps its "absent" defaults)."""
        return cls(
            config_name=type(config).__name__,
            max_staleness=config.max_staleness,
            steps_per_generation=config.steps_per_generation,
            num_iterations=config.num_iterations,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            uses_vllm=bool(config.use_vllm),
            vllm_mode=config.vllm_mode if config.use_vllm else None,
            continuous_batching=bool(getattr(config, "use_transformers_continuous_batching", False)),
        )


@dataclass(frozen=True)
class RunCondition:
    """A kind of run, as a generator's rule names it.

    Attributes:
        short: a few words for the help and the docs (``"a vision-language model"``).
        holds: whether an :class:`AheadRun` is one.
        explained: what an error says of it, the run's values and the way out included: a ``str.format`` template
            over the fields of :class:`AheadRun` (empty: ``short``).
    """

    short: str
    holds: Callable[[AheadRun], bool]
    explained: str = ""

    def describe(self, run: AheadRun) -> str:
        """The words an error uses for ``run``."""
        return self.explained.format(**dataclasses.asdict(run)) if self.explained else self.short


#: What every generator that samples ahead of the trainer needs (its run shape): a lag to sample in, and one batch per
#: optimizer step, since it hands the trainer the batch of each step.
SAMPLES_AHEAD_SHAPE = (
    RunCondition(
        "max_staleness=0",
        lambda run: run.max_staleness < 1,
        "max_staleness={max_staleness} (it samples ahead of the trainer, which needs a lag: set max_staleness >= 1, "
        "or use async_generator='inline')",
    ),
    RunCondition(
        "more or less than one generation per optimizer step",
        lambda run: not run.one_generation_per_step,
        "more or less than one generation per optimizer step (steps_per_generation * num_iterations must equal "
        "gradient_accumulation_steps): {config_name} has steps_per_generation={steps_per_generation}, "
        "num_iterations={num_iterations} and gradient_accumulation_steps={gradient_accumulation_steps}. Set "
        "steps_per_generation={gradient_accumulation_steps} (without generation_batch_size) and num_iterations=1: "
        "the pipeline's staleness then takes the ratio off 1. Or use async_generator='inline', which samples a "
        "generation batch for any number of steps",
    ),
)

#: A ``rollout_func``, which a generator that samples ahead would never call.
A_ROLLOUT_FUNC = RunCondition(
    "a rollout_func",
    lambda run: run.rollout_func,
    "a rollout_func (it samples the batches ahead itself and would never call it: async_generator='inline' calls it "
    "with the behaviour weights in the model, and a vLLM engine synced with them)",
)


@dataclass(frozen=True)
class GeneratorDeclaration:
    """One generator of ``async_generator``.

    Attributes:
        help: what it is, for the user (``--help``, the config's docstring).
        samples_ahead: its run shape. ``True``: it samples the next ``max_staleness`` batches ahead of the trainer,
            also where the run keeps snapshots of its weights, so it refuses :data:`SAMPLES_AHEAD_SHAPE` besides
            ``refuses``. ``False``: it samples in the training process, ahead where nothing keeps snapshots, else at
            each step through TRL's own generation (``trl_samples_where``).
        refuses: the runs it cannot sample as TRL's ``_generate`` would, each named with its way out.
        trl_samples_where: without ``samples_ahead``, the runs whose batches TRL's own generation samples, each at its
            step with the weights of ``k`` steps earlier (the run then keeps their snapshots).
    """

    help: str
    samples_ahead: bool
    refuses: tuple[RunCondition, ...] = ()
    trl_samples_where: tuple[RunCondition, ...] = ()

    def all_refused(self) -> tuple[RunCondition, ...]:
        """Every kind of run it refuses, its run shape's first."""
        return (SAMPLES_AHEAD_SHAPE if self.samples_ahead else ()) + self.refuses

    def refused(self, run: AheadRun) -> list[str]:
        """What of ``run`` it cannot sample, each with its way out (none: ``[]``)."""
        return [condition.describe(run) for condition in self.all_refused() if condition.holds(run)]

    def step_time_reason(self, run: AheadRun) -> str | None:
        """Why TRL's own generation samples ``run``'s batches at their steps (``None``: they are sampled ahead)."""
        found = [condition.short for condition in self.trl_samples_where if condition.holds(run)]
        return f"TRL's own generation samples each batch at its step ({', '.join(found)})" if found else None

    def summary(self) -> str:
        """Its help, then what it does not sample (the field's help and docstring list it)."""
        refused = "; ".join(condition.short for condition in self.all_refused())
        return f"{self.help} Not for: {refused}." if refused else self.help


class GeneratorRegistry:
    """The declared generators, in declaration order (the order ``--help`` lists them)."""

    def __init__(self) -> None:
        self._declared: dict[str, GeneratorDeclaration] = {}

    def declare(self, name: str, declaration: GeneratorDeclaration) -> GeneratorDeclaration:
        """Add ``name``; a name can be declared once."""
        if name in self._declared:
            raise ValueError(f"{FIELD} {name!r} is already declared")
        self._declared[name] = declaration
        return declaration

    def undeclare(self, name: str) -> None:
        """Remove ``name`` (a generator declared for a test); an unknown name raises."""
        self.get(name)
        del self._declared[name]

    def get(self, name: Any) -> GeneratorDeclaration:
        """The declaration of ``name``; an unknown name raises a ``ValueError`` naming the field and the known ones."""
        try:
            return self._declared[name]
        except (KeyError, TypeError):
            raise ValueError(f"Unknown {FIELD} {name!r}. Allowed values: {', '.join(self.names())}.") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._declared)

    def __contains__(self, name: object) -> bool:
        return name in self._declared

    def check_known(self, name: Any) -> None:
        """Refuse an ``async_generator`` that is not declared, naming the field and the declared ones."""
        if name not in self:
            names = [repr(known) for known in self.names()]
            listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
            raise ValueError(f"{FIELD} must be {listed}, got {name!r}.")

    def refusal(self, name: str, run: AheadRun) -> str | None:
        """The error for what of ``run`` the generator ``name`` cannot sample (``None``: it can sample all of it)."""
        found = self.get(name).refused(run)
        return f"{FIELD}={name!r} does not support {'; '.join(found)}." if found else None

    def help_text(self) -> str:
        """``"inline: ... process: ..."``: each generator with its summary."""
        return " ".join(f"{name}: {declaration.summary()}" for name, declaration in self._declared.items())


GENERATORS = GeneratorRegistry()

GENERATORS.declare(
    "inline",
    GeneratorDeclaration(
        help="In the training process, when the batch is needed (the same lag, no overlap in time).",
        samples_ahead=False,
        trl_samples_where=(
            RunCondition("use_vllm=True", lambda run: run.uses_vllm),
            RunCondition("use_transformers_continuous_batching=True", lambda run: run.continuous_batching),
            RunCondition("tools or environments", lambda run: run.tools),
            RunCondition("a vision-language model", lambda run: run.vision_language),
            RunCondition("a rollout_func", lambda run: run.rollout_func),
            RunCondition(
                "more or less than one generation per optimizer step", lambda run: not run.one_generation_per_step
            ),
        ),
    ),
)

GENERATORS.declare(
    "process",
    GeneratorDeclaration(
        help="A worker process with its own copy of the model samples the next max_staleness batches with HF "
        "generate while the trainer trains (each call seeded, so it samples the batches the inline generator would); "
        "tools and environments run, each later turn sampled by the worker with the batch's weights.",
        samples_ahead=True,
        refuses=(
            RunCondition(
                "use_vllm=True",
                lambda run: run.uses_vllm,
                "use_vllm=True (vLLM is its own engine: use async_generator='server' or 'inline')",
            ),
            RunCondition("a vision-language model", lambda run: run.vision_language),
            RunCondition("a bitsandbytes-quantized model", lambda run: run.quantized),
            A_ROLLOUT_FUNC,
            RunCondition(
                "transformers' continuous batching",
                lambda run: run.continuous_batching,
                "use_transformers_continuous_batching=True (or use_transformers_paged; the worker samples with HF "
                "generate: set it False, or use async_generator='inline')",
            ),
        ),
    ),
)

GENERATORS.declare(
    "server",
    GeneratorDeclaration(
        help="TRL's vLLM server (use_vllm=True, vllm_mode='server') samples the next max_staleness batches while the "
        "trainer trains: each batch's behaviour weights are pushed with TRL's weight sync once they exist, and its "
        "prompts sent ahead (the server's own sampling seeds).",
        samples_ahead=True,
        refuses=(
            RunCondition(
                "a run without use_vllm=True and vllm_mode='server'",
                lambda run: not run.uses_vllm or run.vllm_mode != "server",
                "use_vllm={uses_vllm}, vllm_mode={vllm_mode!r} (it sends the batches ahead to TRL's vLLM server: set "
                "use_vllm=True and vllm_mode='server', or use async_generator='process', HF generate in a worker "
                "process)",
            ),
            RunCondition(
                "tools or environments with more than one training process",
                lambda run: run.tools and run.processes > 1,
                "tools or environments with more than one training process (each process's tool loop asks for its "
                "later turns on its own, while the server's requests are gathered from every process: train on one "
                "process, or use async_generator='inline')",
            ),
            RunCondition(
                "tools or environments with DPPO's top-K divergence from the engine",
                lambda run: run.tools and run.engine_topk,
                "tools or environments with DPPO's top-K divergence (the server's top-K of the turns after the first "
                "is not kept with the batch: use async_generator='inline')",
            ),
            RunCondition(
                "a vision-language model",
                lambda run: run.vision_language,
                "a vision-language model (its image features are not sent ahead)",
            ),
            A_ROLLOUT_FUNC,
        ),
    ),
)
