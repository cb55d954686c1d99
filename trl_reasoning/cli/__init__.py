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
(``run``/``main``: which command runs, and under ``accelerate launch`` when asked). Their names are re-exported here:
``trl_reasoning.cli:main`` is the console script's entry point and ``python -m trl_reasoning.cli`` runs ``main``.
"""

from __future__ import annotations

from .arguments import (
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
from .commands import (
    evaluate,
    list_recipes,
    load_task_dataset,
    model_command,
    recipes_command,
    recipes_dir,
    train,
)
from .dispatch import LAUNCH_FLAGS, main, run

__all__ = [
    "LAUNCH_FLAGS",
    "PRESET_PLACEHOLDER",
    "REWARD_FUNCS",
    "TRAINERS",
    "DataArguments",
    "EvalArguments",
    "available_presets",
    "evaluate",
    "fill_preset_name",
    "list_recipes",
    "load_preset",
    "load_task_dataset",
    "main",
    "make_parser",
    "model_command",
    "parse",
    "recipes_command",
    "recipes_dir",
    "resolve_reward_funcs",
    "run",
    "train",
    "trl_soft_overlong_punishment",
]
