"""Which command runs: ``run`` reads the command line, prints the usage, launches ``accelerate`` for
``--num_processes``/``--accelerate_config``, and hands the rest to the command's parser and function."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from ..utils.threads import torch_threads
from .arguments import TRAINERS, load_preset, parse
from .commands import end_processes, evaluate, model_command, recipes_command, train
from .usage import asks_for_usage, usage

#: Flags of an algorithm subcommand that go to `accelerate launch` rather than to the training config (as `trl grpo`).
LAUNCH_FLAGS = {"--num_processes": "--num_processes", "--accelerate_config": "--config_file"}


def _launch_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split `argv` into `accelerate launch` arguments (`--num_processes N`, `--accelerate_config FILE`) and the rest."""
    launch, rest = [], []
    items = iter(argv)
    for item in items:
        flag, _, value = item.partition("=")
        if flag in LAUNCH_FLAGS:
            if not value:
                value = next(items, None)
                if value is None:
                    raise SystemExit(f"trl-reasoning: {flag} needs a value.")
            launch += [LAUNCH_FLAGS[flag], value]
        else:
            rest.append(item)
    return launch, rest


def _launch(launch_args: list[str], command: str, rest: list[str]) -> None:
    """Run this command under `accelerate launch` (as `trl grpo --num_processes N` does). Without an accelerate config,
    N > 1 processes are launched with `--multi_gpu`, which also starts N gloo processes on a CPU machine with
    `--use_cpu true` (accelerate's `--cpu` would start one)."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    processes = int(launch_args[launch_args.index("--num_processes") + 1]) if "--num_processes" in launch_args else 1
    if "--config_file" not in launch_args and processes > 1:
        launch_args = [*launch_args, "--multi_gpu"]
    arguments = launch_command_parser().parse_args([*launch_args, "-m", "trl_reasoning.cli", command, *rest])
    launch_command(arguments)


def _train_usage() -> str:
    """`trl-reasoning train --help` without a preset: how `train` is called and where each preset's fields are."""
    return "\n".join(
        [
            "usage: trl-reasoning train --preset NAME [--config recipe.yaml] [--field value ...]",
            "",
            "The same as `trl-reasoning NAME ...`, with the preset as a flag (for scripts that loop over presets):",
            "one recipe serves every preset.",
            "",
            "presets:",
            *[f"  {name:<10} {trainer.__name__} ({config.__name__})" for name, (config, trainer) in TRAINERS.items()],
            "",
            "`trl-reasoning train --preset NAME --help` lists every field with that preset's defaults.",
        ]
    )


def _wants_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for help (``-h``/``--help``) before a ``--`` that ends the options."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return any(arg in ("-h", "--help") for arg in options)


def _preset_of_train(argv: list[str]) -> tuple[str, list[str]]:
    """`train --preset NAME ...` is `NAME ...`: the preset's subcommand with the other arguments."""
    for i, arg in enumerate(argv):
        if arg == "--preset" and i + 1 < len(argv):
            name, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
            break
        if arg.startswith("--preset="):
            name, rest = arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
            break
    else:
        raise SystemExit(f"trl-reasoning train: --preset is required, one of {', '.join(TRAINERS)}.")
    if name not in TRAINERS:
        raise SystemExit(f"trl-reasoning train: unknown --preset {name!r}, one of {', '.join(TRAINERS)}.")
    return name, rest


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `trl-reasoning` console script (exit status 0 on success)."""
    run(argv)


def run(argv: Sequence[str] | None = None) -> Any:
    """
    Run a `trl-reasoning` command line and return its result: the trained trainer for an algorithm subcommand, the
    demo's results dict for `demo`, the metrics dict for `eval`, the recipes (or the folder they were copied to) for
    `recipes`, `None` for the usage text.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if asks_for_usage(argv):
        print(usage())
        return None
    command, rest = argv[0], argv[1:]
    if command == "train":
        if _wants_help(rest) and not any(arg == "--preset" or arg.startswith("--preset=") for arg in rest):
            print(_train_usage())
            return None
        command, rest = _preset_of_train(rest)
    if command == "recipes":
        return recipes_command(rest)
    if command == "model":
        return model_command(rest)
    if command not in ("demo", "eval") and command not in TRAINERS:
        print(usage(), file=sys.stderr)
        raise SystemExit(f"trl-reasoning: unknown command {command!r}.")
    if command == "demo":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from ..demo.run import run_demo

        demo_args, training_args = parse("demo", rest)
        _, trainer_class = load_preset(demo_args.algorithm)
        return run_demo(demo_args, training_args, trainer_class)
    launch_args, rest = _launch_arguments(rest)
    if launch_args:
        return _launch(launch_args, command, rest)
    if command == "eval":
        (eval_args,) = parse("eval", rest)
        with torch_threads(eval_args.num_threads):
            result = evaluate(eval_args)
    else:
        data_args, training_args, model_args, mixture = parse(command, rest)
        with torch_threads(data_args.num_threads):
            result = train(data_args, training_args, model_args, load_preset(command)[1], mixture)
    end_processes()  # under `accelerate launch`: both commands leave no process group alive at exit
    return result
