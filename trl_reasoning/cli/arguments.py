"""The arguments of the ``trl-reasoning`` commands: the algorithm subcommands (``TRAINERS``), the reward functions by
name, the dataclasses each subcommand parses and ``parse``, which reads a ``--config`` recipe and the flags into
them."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl import ScriptArguments

from ..config import ReasoningConfig
from ..presets import PRESETS
from ..tasks import TASKS
from ..trainer.base import ReasoningTrainer

#: Algorithm subcommand -> (config class, trainer class): every preset, then the base trainer.
TRAINERS: dict[str, tuple[type, type]] = {
    **{entry.name: (entry.config_class, entry.trainer_class) for entry in PRESETS},
    "reasoning": (ReasoningConfig, ReasoningTrainer),
}


def trl_soft_overlong_punishment() -> Callable:
    """TRL's `get_soft_overlong_punishment` reward with the values `trl grpo` gives it for this name
    (`max_completion_len=1280`, `soft_punish_cache=256`, fixed there as here). For other values, or DAPO's overlong
    shaping tied to `max_completion_length`, use the presets' `overlong_cache_length` instead."""
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)


#: ``--num_threads`` of ``train`` and ``evaluate``.
NUM_THREADS_HELP = (
    "torch threads on the CPU: unset = auto (torch's default less the cores other processes keep busy when the "
    "command starts), 0 = torch's default, n = exactly n."
)
#: Reward functions selectable by name in `--reward_funcs` (a dotted import path works too): "module:attribute", or a
#: function that builds the reward (for TRL's reward factories).
REWARD_FUNCS: dict[str, str | Callable[[], Callable]] = {
    # TRL's own (the names `trl grpo` accepts)
    "accuracy_reward": "trl.rewards:accuracy_reward",
    "reasoning_accuracy_reward": "trl.rewards:reasoning_accuracy_reward",
    "think_format_reward": "trl.rewards:think_format_reward",
    "get_soft_overlong_punishment": trl_soft_overlong_punishment,
    # this package's
    "math_answer_reward": "trl_reasoning.rewards.math_answers:math_answer_reward",
    "exact_match_reward": "trl_reasoning.tasks.digit_reversal:exact_match_reward",
    "digit_reward": "trl_reasoning.tasks.digit_reversal:digit_reward",
    "last_number_reward": "trl_reasoning.tasks.arithmetic:last_number_reward",
}


def available_presets() -> list[str]:
    """The algorithm subcommands: every preset's name, then ``reasoning``."""
    return list(TRAINERS)


def load_preset(name: str) -> tuple[type, type]:
    """The `(config class, trainer class)` of an algorithm subcommand; an unknown name lists the available ones."""
    if name not in TRAINERS:
        raise ValueError(f"Unknown algorithm {name!r}. Available: {', '.join(TRAINERS)}.")
    return TRAINERS[name]


def resolve_reward_funcs(names: Sequence[str]) -> list[Callable]:
    """Reward functions from names in `REWARD_FUNCS` or dotted import paths (`my_pkg.rewards.fn`)."""
    funcs = []
    for name in names:
        target = REWARD_FUNCS.get(name)
        if target is None and "." in name:
            target = ":".join(name.rsplit(".", 1))
        if target is None:
            raise ValueError(
                f"--reward_funcs: unknown reward function {name!r}. Use one of {', '.join(REWARD_FUNCS)} or a dotted "
                "import path such as 'my_package.rewards.my_reward'."
            )
        if callable(target):
            funcs.append(target())
            continue
        module, attribute = target.split(":")
        sys.path.insert(0, os.getcwd())
        try:
            funcs.append(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError) as error:
            raise ValueError(f"--reward_funcs: cannot import {name!r} ({error}).") from error
        finally:
            sys.path.remove(os.getcwd())
    return funcs


@dataclass
class DataArguments(ScriptArguments):
    r"""
    Dataset and reward arguments of the algorithm subcommands: TRL's `ScriptArguments` (`dataset_name`,
    `dataset_config`, `dataset_train_split`, `dataset_test_split`, `dataset_streaming`) plus a task and rewards. TRL's
    dataset mixtures (`datasets:` in the YAML, `DatasetMixtureConfig`) are accepted as in `trl grpo`.

    Parameters:
        dataset_name (`str`, *optional*):
            A dataset for `datasets.load_dataset`: a Hub id, a local folder, or one local data file (`.jsonl`,
            `.json`, `.csv`, `.parquet`, `.txt`; its rows are the `train` split). Set by `task` when unset.
        task (`str`, *optional*):
            A task of `trl_reasoning.tasks.TASKS`, which sets the dataset and the default reward (`--help` lists
            them): `"gsm8k"` (GSM8K prompts, `math_answer_reward`), `"arithmetic"` (the real-model main job's
            one-step additions, `last_number_reward`; pair it with `model_name_or_path: smollm2-135m-instruct`) or
            `"reverse"` (the embedded digit-reversal task, with the cached warm-start tiny model when
            `model_name_or_path` is unset).
        reward_funcs (`list[str]`, *optional*):
            Reward function names (TRL's `accuracy_reward`, `reasoning_accuracy_reward`, `think_format_reward`,
            `get_soft_overlong_punishment`; this
            package's `math_answer_reward`, `exact_match_reward`, `digit_reward`, `last_number_reward`) or dotted import
            paths. One name (a
            YAML string) is a list of one. Defaults to the task's reward.
        pass_at_k_samples (`int`, *optional*, defaults to `0`):
            With a held-out split, log pass@k every `eval_steps` from this many samples per prompt (0 = off).
        pass_at_k (`list[int]`, *optional*, defaults to `[1]`):
            The `k` values logged by the pass@k evaluation.
        pass_at_k_max_prompts (`int`, *optional*):
            Evaluate pass@k on at most this many held-out prompts.
        num_threads (`int`, *optional*):
            torch intra-op threads on the CPU: unset = auto (torch's default, one per core, less the cores other
            processes keep busy when the command starts, shared among the run's processes on this machine; see
            `trl_reasoning.utils.threads`), `0` = torch's default, `n` = exactly `n`.
    """

    task: str | None = field(
        default=None,
        metadata={"help": f"Embedded task: {TASKS.help()}."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": f"Reward functions: {', '.join(REWARD_FUNCS)} or dotted import paths."},
    )
    pass_at_k_samples: int = field(
        default=0, metadata={"help": "Samples per held-out prompt for pass@k logging every eval_steps (0 = off)."}
    )
    pass_at_k: list[int] = field(default_factory=lambda: [1], metadata={"help": "k values of the pass@k logging."})
    pass_at_k_max_prompts: int | None = field(default=None, metadata={"help": "Held-out prompts for pass@k."})
    num_threads: int | None = field(default=None, metadata={"help": NUM_THREADS_HELP})

    def __post_init__(self):
        self.reward_funcs = _as_list(self.reward_funcs)
        if self.task is not None:
            TASKS.get(self.task, "--task")  # an unknown task is refused with the known ones
        if self.pass_at_k_samples < 0:
            raise ValueError(f"--pass_at_k_samples must be >= 0, got {self.pass_at_k_samples}.")
        if self.pass_at_k_samples and any(not 1 <= k <= self.pass_at_k_samples for k in self.pass_at_k):
            raise ValueError(
                f"--pass_at_k: every k must be between 1 and --pass_at_k_samples={self.pass_at_k_samples}, got "
                f"{self.pass_at_k}."
            )


@dataclass
class EvalArguments:
    r"""
    Arguments of `trl-reasoning eval`: pass@k of a saved model on a dataset with a reward function.

    Parameters:
        model_name_or_path (`str`):
            The model folder (or Hub id) to evaluate.
        task, dataset_name, dataset_config, split:
            What to evaluate on: `task` (one of `trl_reasoning.tasks.TASKS`: `"gsm8k"`, `"arithmetic"`,
            `"reverse"`), or any dataset with a `prompt` column.
        reward_funcs (`list[str]`, *optional*):
            As for training; defaults to the task's reward.
        num_samples (`int`, *optional*, defaults to `8`), ks (`list[int]`, *optional*, defaults to `[1, 8]`):
            `n` and the `k` values of pass@k.
        max_new_tokens, temperature, top_p, top_k, batch_size, max_prompts, success_threshold:
            Sampling and evaluation settings (see `trl_reasoning.evaluation.callbacks.evaluate_pass_at_k`).
        output_json (`str`, *optional*):
            Also write the metrics to this JSON file.
        seed (`int`, *optional*, defaults to `0`):
            Sampling seed (each process draws from `seed + its index`).
        use_cpu (`bool`, *optional*, defaults to `False`):
            Evaluate on the CPU even if a GPU is there (as the training argument of that name).
        num_threads (`int`, *optional*):
            torch intra-op threads on the CPU: unset = auto (torch's default, one per core, less the cores other
            processes keep busy when the command starts, shared among the run's processes on this machine; see
            `trl_reasoning.utils.threads`), `0` = torch's default, `n` = exactly `n`.

    With `--num_processes N` (or `--accelerate_config FILE`) the command runs under `accelerate launch`: each
    process evaluates its share of the prompts and the counts are gathered, so the metrics are those of one process.
    """

    model_name_or_path: str | None = field(default=None, metadata={"help": "Model folder or Hub id to evaluate."})
    task: str | None = field(default=None, metadata={"help": f"Embedded task: {TASKS.help(describe=False)}."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset for datasets.load_dataset."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    split: str = field(default="test", metadata={"help": "Split to evaluate."})
    reward_funcs: list[str] | None = field(default=None, metadata={"help": "Reward functions judging correctness."})
    num_samples: int = field(default=8, metadata={"help": "Samples per prompt (n)."})
    ks: list[int] = field(default_factory=lambda: [1, 8], metadata={"help": "k values of pass@k."})
    max_new_tokens: int = field(default=256, metadata={"help": "Maximum completion length."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0 = off)."})
    batch_size: int = field(default=32, metadata={"help": "Prompts per generate call."})
    max_prompts: int | None = field(default=None, metadata={"help": "Evaluate at most this many prompts."})
    success_threshold: float = field(default=1.0, metadata={"help": "Reward at or above which a sample is correct."})
    greedy: bool = field(default=True, metadata={"help": "Also report greedy accuracy."})
    output_json: str | None = field(default=None, metadata={"help": "Write the metrics to this JSON file."})
    seed: int = field(default=0, metadata={"help": "Sampling seed (each process uses seed + its index)."})
    use_cpu: bool = field(default=False, metadata={"help": "Evaluate on the CPU even if a GPU is available."})
    num_threads: int | None = field(default=None, metadata={"help": NUM_THREADS_HELP})

    def __post_init__(self):
        self.reward_funcs = _as_list(self.reward_funcs)
        if self.task is not None:
            TASKS.get(self.task, "--task")  # an unknown task is refused with the known ones


def _as_list(value: Any) -> list | None:
    """A YAML `reward_funcs: my_module.fn` is one string, not a list of characters."""
    return [value] if isinstance(value, str) else value


def _prescan_flag(argv: Sequence[str], key: str) -> Any:
    """The value of `--key` on the command line (`True` for a bare flag), else `None`."""
    flag = f"--{key}"
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _prescan(argv: Sequence[str], key: str) -> Any:
    """The value of `--key` on the command line, else of `key:` in the `--config` YAML, else `None`."""
    value = _prescan_flag(argv, key)
    if value is not None:
        return value
    if "--config" in argv:
        import yaml

        index = list(argv).index("--config")
        if index + 1 >= len(argv):
            raise ValueError("--config needs a YAML file path.")
        with open(argv[index + 1]) as handle:
            config = yaml.safe_load(handle) or {}
        return config.get(key)
    return None


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true", "yes")


def make_parser(command: str, defaults: dict[str, Any] | None = None):
    """The `TrlParser` of a subcommand (an algorithm, `demo` with its `--algorithm`'s config, or `eval`)."""
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    prog = f"trl-reasoning {command}"
    if command == "eval":
        parser = TrlParser((EvalArguments,), prog=prog)
    elif command == "demo":
        from ..demo.run import DemoArguments

        algorithm = (defaults or {}).get("algorithm", "dapo")
        config_class, _ = load_preset(algorithm)
        parser = TrlParser((DemoArguments, config_class), prog=prog, description=_demo_description())
    else:
        config_class, trainer_class = load_preset(command)
        parser = TrlParser(
            (DataArguments, config_class, ModelConfig, DatasetMixtureConfig),
            prog=prog,
            description=f"Train with {trainer_class.__name__} ({config_class.__name__}: the defaults below are "
            f"{getattr(trainer_class, '_name', command)}'s).",
        )
    _escape_percent_signs(parser)
    if defaults:
        parser.set_defaults(**defaults)
    return parser


def _escape_percent_signs(parser) -> None:
    """argparse %-formats help strings: a literal `%` in a field's help text ("20% of …") would break `--help`."""
    for action in parser._actions:
        if action.help:
            action.help = re.sub(r"%(?![(%])", "%%", action.help)


def _demo_description() -> str:
    return (
        "Train a model with an RL preset, offline, and compare held-out accuracy, pass@1, pass@k and completion length "
        "before and after: by default the real SmolLM2-135M-Instruct with LoRA on one-step arithmetic; with --model "
        "tiny (or --fast) a tiny model warm-started with SFT on a digit-reversal task taught by a sloppy teacher."
    )


def parse(command: str, argv: Sequence[str]) -> tuple:
    """Parse `argv` for `command` into its dataclasses (the YAML of `--config` first, then the flags)."""
    argv = list(argv)
    _check_recipe_path(argv)
    defaults: dict[str, Any] = {}
    if command == "demo":
        from ..demo.run import DEFAULT_MODEL, FAST_DEMO_DEFAULTS, TINY_MODEL, demo_training_defaults

        algorithm = _prescan(argv, "algorithm") or "dapo"
        fast = _truthy(_prescan(argv, "fast"))
        num_digits = int(_prescan(argv, "num_digits") or 4)
        model = _prescan(argv, "model") or (TINY_MODEL if fast else DEFAULT_MODEL)
        defaults = {"algorithm": algorithm, "model": model, **demo_training_defaults(num_digits, fast, model)}
        if fast:
            defaults.update(FAST_DEMO_DEFAULTS)
        parser = make_parser("demo", defaults)
    else:
        parser = make_parser(command)
    parsed = parser.parse_args_and_config(argv)
    if command not in ("demo", "eval"):
        _, training_args, *_ = parsed
        training_args.output_dir = fill_preset_name(training_args.output_dir, command)
    return parsed


def _check_recipe_path(argv: Sequence[str]) -> None:
    """A `--config` file that does not exist is named, with where the shipped recipes are listed."""
    path = _prescan_flag(argv, "config")
    if not isinstance(path, str) or os.path.isfile(path):
        return
    raise SystemExit(
        f"trl-reasoning: --config {path}: no such recipe file. `trl-reasoning recipes` lists the shipped ones "
        "(`--copy DIR` copies them)."
    )


#: Written in a recipe's `output_dir`, becomes the algorithm subcommand's name, so one recipe serves every preset
#: (`output_dir: outputs/qwen2.5-1.5b-gsm8k-{preset}` trains `dapo` into `outputs/qwen2.5-1.5b-gsm8k-dapo`).
PRESET_PLACEHOLDER = "{preset}"


def fill_preset_name(output_dir: str | None, command: str) -> str | None:
    """`output_dir` with every `{preset}` replaced by the subcommand's name (`dapo`, `reasoning`, ...)."""
    return output_dir.replace(PRESET_PLACEHOLDER, command) if output_dir else output_dir
