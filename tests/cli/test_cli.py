"""The `trl-reasoning` CLI: subcommands, TrlParser YAML + flags, --help defaults, training, eval, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trl_reasoning import PRESETS, ReasoningConfig, ReasoningTrainer, cli
from trl_reasoning.cli import dispatch
from trl_reasoning.rewards.math_answers import math_answer_reward
from trl_reasoning.tasks import TASKS, CliTask

ROOT = Path(__file__).resolve().parents[2]


def test_usage_lists_every_preset(capsys):
    cli.run([])
    out = capsys.readouterr().out
    for name in [entry.name for entry in PRESETS] + ["reasoning", "demo", "eval", "recipes", "model"]:
        assert f"  {name} " in out
    for entry in PRESETS:
        assert f"train with {entry.trainer_class.__name__} ({entry.config_class.__name__})" in out


def test_the_algorithm_subcommands_are_the_presets_and_the_base_trainer():
    assert cli.available_presets() == [entry.name for entry in PRESETS] + ["reasoning"]
    for entry in PRESETS:
        assert cli.load_preset(entry.name) == (entry.config_class, entry.trainer_class)
    assert cli.load_preset("reasoning") == (ReasoningConfig, ReasoningTrainer)


def test_unknown_command_and_algorithm():
    with pytest.raises(SystemExit, match="unknown command 'ppo'"):
        cli.run(["ppo"])
    with pytest.raises(ValueError, match="Unknown algorithm 'ppo'. Available: dapo, cispo, .*, reasoning."):
        cli.load_preset("ppo")


def test_preset_placeholder_in_output_dir_becomes_the_subcommand():
    _, args, _, _ = cli.parse("dr_grpo", ["--output_dir", "runs/{preset}/x-{preset}", "--use_cpu", "true"])
    assert args.output_dir == "runs/dr_grpo/x-dr_grpo"
    _, args, _, _ = cli.parse("reasoning", ["--output_dir", "runs/plain", "--use_cpu", "true"])
    assert args.output_dir == "runs/plain"


def test_help_lists_the_algorithm_fields_with_paper_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.run(["dapo", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trl-reasoning dapo" in out
    assert "--epsilon_high EPSILON_HIGH" in out and "(default: 0.28)" in out
    assert "--policy_loss POLICY_LOSS" in out and "(default: clip)" in out
    assert "--model_name_or_path" in out and "--reward_funcs" in out and "--pass_at_k_samples" in out


def test_yaml_sets_defaults_and_flags_override(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("task: gsm8k\nlearning_rate: 2.0e-6\nepsilon_high: 4.0\nmodel_name_or_path: org/model\n")
    data, args, model, _ = cli.parse(
        "cispo",
        ["--config", str(recipe), "--learning_rate", "3e-6", "--use_cpu", "true", "--output_dir", str(tmp_path)],
    )
    assert type(args).__name__ == "CISPOConfig"
    assert args.learning_rate == 3e-6 and args.epsilon_high == 4.0 and args.policy_loss == "cispo"
    assert data.task == "gsm8k" and model.model_name_or_path == "org/model"


@pytest.mark.parametrize("command", ["dapo", "eval"])
def test_an_unknown_task_is_refused_naming_the_option_and_the_known_tasks(command):
    known = ", ".join(TASKS.names())
    with pytest.raises(ValueError, match=f"--task: unknown task 'algebra'. Known tasks: {known}."):
        cli.parse(command, ["--task", "algebra", *(["--use_cpu", "true"] if command != "eval" else [])])


@pytest.mark.parametrize("command", ["dapo", "eval"])
def test_help_lists_exactly_the_registered_tasks(command, capsys):
    with pytest.raises(SystemExit):
        cli.run([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    task_help = re.search(r"--task TASK (.*?) \(default: None\)", out).group(1)
    assert (
        re.findall(r"'(\w+)'", task_help) == list(TASKS.names()) == ["arithmetic", "gsm8k", "reverse", "tool_multiply"]
    )


def test_a_registered_task_is_a_task_of_the_cli_with_no_cli_change():
    """Adding a task is its registration: ``--task`` accepts it, its rows are the dataset, its reward the default."""

    class Echo:
        def rl_rows(self, split):
            return [{"prompt": [{"role": "user", "content": f"{split} {i}"}], "answer": str(i)} for i in range(3)]

    TASKS.register(CliTask(name="echo", help="says the number back", reward="exact_match_reward", build=Echo))
    try:
        dataset = cli.load_task_dataset("echo", None, None)
        assert dataset["test"][2]["answer"] == "2" and len(dataset["train"]) == 3
        assert cli.commands._reward_funcs(None, "echo")[0].__name__ == "exact_match_reward"
        data, *_ = cli.parse("dapo", ["--task", "echo", "--use_cpu", "true"])
        assert data.task == "echo"
    finally:
        TASKS.unregister("echo")
    with pytest.raises(ValueError, match="--task: unknown task 'echo'"):
        cli.parse("dapo", ["--task", "echo", "--use_cpu", "true"])


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="--task: unknown task 'algebra'"):
        cli.parse("dapo", ["--task", "algebra", "--use_cpu", "true"])
    with pytest.raises(ValueError, match="--pass_at_k: every k must be between 1 and --pass_at_k_samples=2"):
        cli.parse("dapo", ["--pass_at_k_samples", "2", "--pass_at_k", "1", "4", "--use_cpu", "true"])
    with pytest.raises(ValueError, match="Unknown policy loss .nope."):
        cli.parse("dapo", ["--policy_loss", "nope", "--use_cpu", "true"])
    with pytest.raises(ValueError, match="--reward_funcs: unknown reward function 'nope'"):
        cli.resolve_reward_funcs(["nope"])
    with pytest.raises(ValueError, match="cannot import 'nowhere.fn'"):
        cli.resolve_reward_funcs(["nowhere.fn"])
    assert cli.resolve_reward_funcs(["math_answer_reward", "trl_reasoning.tasks.digit_reversal.digit_reward"]) == [
        math_answer_reward,
        cli.resolve_reward_funcs(["digit_reward"])[0],
    ]


def test_none_on_the_command_line_is_none_and_a_missing_data_file_is_named(tmp_path, monkeypatch):
    """``--ratio_anchor None`` unsets the field (as YAML's ``null``), not the anchor "None"; a local data file name
    that is no file fails with "no such file", not a Hub lookup."""
    from trl_reasoning.cli.commands import load_task_dataset

    training_args = cli.parse("dapo", ["--ratio_anchor", "None", "--use_cpu", "true"])[1]
    assert training_args.ratio_anchor == cli.parse("dapo", ["--use_cpu", "true"])[1].ratio_anchor == "pi_old"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"--dataset_name 'nothere.jsonl': no such file"):
        load_task_dataset(None, "nothere.jsonl", None)


@pytest.mark.slow
def test_algorithm_subcommand_trains_saves_and_evaluates(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    trainer = cli.run(
        [
            "dapo",
            "--config",
            str(ROOT / "recipes/reverse/tiny-cpu.yaml"),
            "--model_name_or_path",
            tiny_model_path,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--pass_at_k_samples",
            "2",
            "--pass_at_k",
            "1",
            "2",
            "--pass_at_k_max_prompts",
            "4",
            "--eval_steps",
            "1",
            "--dynamic_sampling",
            "false",
        ]
    )
    assert type(trainer.args).__name__ == "DAPOConfig" and trainer.state.global_step == 2
    assert sum("eval_pass_at_k/pass@2" in entry for entry in trainer.state.log_history) == 2
    card = (out / "README.md").read_text()
    assert "Trained with **DAPO**" in card and "@article{yu2025dapo," in card
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()

    metrics_file = tmp_path / "metrics.json"
    metrics = cli.run(
        [
            "eval",
            "--model_name_or_path",
            str(out),
            "--task",
            "reverse",
            "--num_samples",
            "2",
            "--ks",
            "1",
            "2",
            "--max_prompts",
            "4",
            "--max_new_tokens",
            "6",
            "--output_json",
            str(metrics_file),
        ]
    )
    assert set(metrics) >= {"pass@1", "pass@2", "accuracy", "reward", "mean_length"} and metrics["num_prompts"] == 4
    assert json.loads(metrics_file.read_text())["pass@2"] == metrics["pass@2"]
    assert "| pass@1 |" in capsys.readouterr().out


def test_eval_needs_a_model_and_a_known_split(tmp_path):
    with pytest.raises(ValueError, match="needs --model_name_or_path"):
        cli.run(["eval", "--task", "reverse"])
    with pytest.raises(ValueError, match="--split: the dataset has no split 'validation'"):
        cli.run(["eval", "--model_name_or_path", str(tmp_path), "--task", "reverse", "--split", "validation"])
    with pytest.raises(ValueError, match="No dataset: set --dataset_name"):
        cli.load_task_dataset(None, None, None)


def test_trl_script_arguments_reward_names_and_dataset_mixtures(tmp_path):
    """The training subcommands take what `trl grpo` takes: TRL's ScriptArguments, its reward-function names, a YAML
    `reward_funcs` string and a `datasets:` mixture (loaded with TRL's `get_dataset`)."""
    import trl
    from trl.rewards import accuracy_reward, think_format_reward

    assert issubclass(cli.DataArguments, trl.ScriptArguments)
    assert cli.resolve_reward_funcs(["accuracy_reward", "think_format_reward"]) == [
        accuracy_reward,
        think_format_reward,
    ]
    data_file = tmp_path / "mine.jsonl"
    data_file.write_text("".join(f'{{"prompt": "{i}+1="}}\n' for i in range(4)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "reward_funcs: trl_reasoning.tasks.digit_reversal.digit_reward\ndataset_streaming: true\n"
        f"datasets:\n  - path: json\n    data_files: {data_file}\n    split: train\n"
    )
    data, _, _, mixture = cli.parse("dapo", ["--config", str(recipe), "--use_cpu", "true"])
    assert data.reward_funcs == ["trl_reasoning.tasks.digit_reversal.digit_reward"] and data.dataset_streaming
    assert trl.get_dataset(mixture)["train"]["prompt"] == [f"{i}+1=" for i in range(4)]


def test_every_reward_name_trl_grpo_accepts_is_accepted():
    """The names come from `trl grpo`'s own registry (its script's source), so a TRL release that adds one fails
    here until the CLI offers it too."""
    import inspect
    import re

    from trl.rewards import get_soft_overlong_punishment
    from trl.scripts import grpo

    registry = re.search(r"reward_funcs_registry = \{(.*?)\n    \}", inspect.getsource(grpo), re.S).group(1)
    trl_names = re.findall(r'^\s*"(\w+)":', registry, re.M)
    assert "get_soft_overlong_punishment" in trl_names and len(trl_names) >= 4
    resolved = cli.resolve_reward_funcs(trl_names)
    assert len(resolved) == len(trl_names) and all(callable(f) for f in resolved)
    ours = resolved[trl_names.index("get_soft_overlong_punishment")]
    theirs = get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
    lengths = [[0] * n for n in (100, 1024, 1100, 1280, 1300)]
    assert ours(completion_ids=lengths) == theirs(completion_ids=lengths)
    assert ours(completion_ids=lengths)[2] == pytest.approx(-(1100 - 1024) / 256)


def test_launch_flags_go_to_accelerate():
    launch, rest = dispatch._launch_arguments(
        ["--num_processes", "2", "--learning_rate", "1e-5", "--accelerate_config=recipes/accelerate/zero2.yaml"]
    )
    assert launch == ["--num_processes", "2", "--config_file", "recipes/accelerate/zero2.yaml"]
    assert rest == ["--learning_rate", "1e-5"]
    with pytest.raises(SystemExit, match="--num_processes needs a value"):
        dispatch._launch_arguments(["--num_processes"])


def test_train_with_a_preset_is_the_presets_command(tmp_path):
    recipe = str(ROOT / "recipes" / "gsm8k" / "qwen2.5-1.5b-lora.yaml")
    assert dispatch._preset_of_train(["--preset", "cispo", "--config", recipe]) == ("cispo", ["--config", recipe])
    assert dispatch._preset_of_train(["--config", recipe, "--preset=dr_grpo"]) == ("dr_grpo", ["--config", recipe])
    with pytest.raises(SystemExit, match="--preset is required, one of dapo, cispo"):
        cli.run(["train", "--config", recipe])
    with pytest.raises(SystemExit, match="unknown --preset 'grpo'"):
        cli.run(["train", "--preset", "grpo"])
    command, rest = dispatch._preset_of_train(["--preset", "rloo", "--config", recipe, "--use_cpu", "--bf16", "false"])
    _, training_args, *_ = cli.parse(command, rest)
    assert type(training_args).__name__ == "RLOOConfig"


def test_train_help_without_a_preset_prints_its_usage_and_exits_0(capsys):
    cli.main(["train", "--help"])  # returns: the console script exits 0 (it exited 1, "--preset is required")
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-reasoning train --preset NAME [--config recipe.yaml]")
    for name, (config, trainer) in cli.TRAINERS.items():
        assert f"  {name:<10} {trainer.__name__} ({config.__name__})" in out
    assert "`trl-reasoning train --preset NAME --help` lists every field" in out
    cli.main(["train", "--config", "any.yaml", "-h"])
    assert capsys.readouterr().out == out
    with pytest.raises(SystemExit) as exit_info:  # with a preset: that preset's fields and defaults
        cli.main(["train", "--preset", "dapo", "--help"])
    assert exit_info.value.code == 0 and "--epsilon_high EPSILON_HIGH" in capsys.readouterr().out


def test_a_missing_recipe_file_is_named():
    old, hint = "my/own.yaml", "`trl-reasoning recipes` lists the shipped ones"
    with pytest.raises(SystemExit) as raised:
        cli.run(["dapo", "--config", old])
    assert f"--config {old}: no such recipe file" in str(raised.value) and hint in str(raised.value)
