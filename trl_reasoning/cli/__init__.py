"""``trl-reasoning``: one subcommand per algorithm, plus ``demo`` and ``eval``.

Every subcommand parses with TRL's ``TrlParser``: a ``--config recipe.yaml`` sets defaults, flags override them, and
every field of the dataclasses involved is settable either way (``--help`` lists them with their defaults, which for
an algorithm are its paper's)::

    trl-reasoning dapo --config recipes/gsm8k/qwen2.5-1.5b.yaml --learning_rate 5e-7
    trl-reasoning demo --algorithm cispo
    trl-reasoning eval --model_name_or_path ./run --task gsm8k --num_samples 16 --ks 1 8 16

The algorithm subcommands are the presets of ``trl_reasoning.presets.PRESETS`` (each named as its module: ``dapo``,
``dr_grpo``, ...) and ``reasoning``, the base trainer with no algorithm field set (TRL's GRPO). A recipe names no
algorithm: the subcommand chooses it, and ``{preset}`` in the recipe's ``output_dir`` becomes the subcommand's name.

``--task NAME`` chooses one of the tasks of ``trl_reasoning.tasks.TASKS``, which each task module registers.

The package's modules: ``arguments`` (what each subcommand parses), ``commands`` (what each one does) and ``dispatch``
(``run``/``main``: which command runs, and under ``accelerate launch`` when asked), and ``usage`` (the top-level
``--help``, which imports no preset). Their public names are answered here on first use, as the package's own are:
importing ``trl_reasoning.cli.usage`` must not import the presets, TRL or torch. ``python -m trl_reasoning.cli`` runs
``main``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below resolve to, for type checkers and editors
    from .arguments import (  # noqa: F401
        PRESET_PLACEHOLDER,
        REWARD_FUNCS,
        TRAINERS,
        DataArguments,
        EvalArguments,
        available_presets,
        fill_preset_name,
        load_preset,
        make_parser,
        parse,
        resolve_reward_funcs,
        trl_soft_overlong_punishment,
    )
    from .commands import (  # noqa: F401
        evaluate,
        list_recipes,
        load_task_dataset,
        model_command,
        recipes_command,
        recipes_dir,
        train,
    )
    from .dispatch import LAUNCH_FLAGS, main, run  # noqa: F401

#: Each public name and the module of this package that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "PRESET_PLACEHOLDER",
            "REWARD_FUNCS",
            "TRAINERS",
            "DataArguments",
            "EvalArguments",
            "available_presets",
            "fill_preset_name",
            "load_preset",
            "make_parser",
            "parse",
            "resolve_reward_funcs",
            "trl_soft_overlong_punishment",
        ),
        "arguments",
    ),
    **dict.fromkeys(
        ("evaluate", "list_recipes", "load_task_dataset", "model_command", "recipes_command", "recipes_dir", "train"),
        "commands",
    ),
    **dict.fromkeys(("LAUNCH_FLAGS", "main", "run"), "dispatch"),
}

#: The modules of this package, answered as attributes as an eager package would have them.
_SUBMODULES = ("arguments", "commands", "dispatch", "usage")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public name (or a submodule: ``cli.commands``), imported on first use and kept in this package's namespace."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
