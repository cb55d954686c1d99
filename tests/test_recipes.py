"""Every recipe parses offline into every preset's config (a recipe holds a task and a model; the subcommand chooses
the preset); accelerate configs load; the demo recipe runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from trl_reasoning import PRESETS, cli
from trl_reasoning.presets import preset

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
#: Every training recipe (a task folder: recipes/<task>/<model>.yaml); accelerate/ holds launcher configs.
TRAINING_RECIPES = sorted(path for path in RECIPES.glob("*/*.yaml") if path.parent.name != "accelerate")
GSM8K_RECIPES = sorted(RECIPES.glob("gsm8k/qwen2.5-*.yaml"))
# Recipes target GPUs (bf16); parsing them here only needs the config to accept a CPU.
CPU = ["--use_cpu", "true"]
#: What a preset sets on the command line over a recipe's value (recipes/README.md says so), keyed by preset name.
PRESET_FLAGS = {
    "rloo": ["--num_generations", "4"],
    "prorl": ["--temperature", "1.2", "--num_generations", "16"],
}


def recipe_id(path: Path) -> str:
    return path.relative_to(RECIPES).with_suffix("").as_posix()


def test_the_gsm8k_recipes_are_full_lora_qlora_and_vllm():
    assert {path.name for path in GSM8K_RECIPES} == {
        f"qwen2.5-1.5b{variant}.yaml" for variant in ("", "-lora", "-qlora", "-vllm")
    }


def test_no_recipe_is_tied_to_one_preset():
    preset_names = {entry.name for entry in PRESETS}
    assert {path.parent.name for path in TRAINING_RECIPES} & preset_names == set(), "recipes/<preset>/ is gone"
    for path in TRAINING_RECIPES:
        output_dir = yaml.safe_load(path.read_text())["output_dir"]
        assert output_dir.endswith(cli.PRESET_PLACEHOLDER), (path, "two presets would share one output_dir")


@pytest.mark.parametrize("entry", PRESETS, ids=lambda entry: entry.name)
@pytest.mark.parametrize("path", TRAINING_RECIPES, ids=recipe_id)
def test_every_recipe_parses_into_every_presets_config(path, entry):
    raw = yaml.safe_load(path.read_text())
    data, args, model, _ = cli.parse(entry.name, ["--config", str(path), *CPU])
    assert type(args) is entry.config_class
    # every key of the YAML landed in one of the three dataclasses, with its value
    for key, value in raw.items():
        owner = next(obj for obj in (data, args, model) if hasattr(obj, key))
        parsed = getattr(owner, key)
        parsed = getattr(parsed, "value", parsed)
        if key == "report_to":
            assert parsed in ([], ["none"], "none"), parsed
        elif key == "output_dir":
            assert parsed == value.replace("{preset}", entry.name)
        elif key != "lr_scheduler_type":
            assert parsed == value, (key, parsed, value)
    # fields the recipe leaves out keep the preset's paper defaults
    for name in ("advantage_estimator", "policy_loss", "loss_aggregation", "beta"):
        assert name in raw or getattr(args, name) == entry.defaults()[name], name
    assert cli.resolve_reward_funcs(data.reward_funcs)


@pytest.mark.parametrize("path", GSM8K_RECIPES, ids=recipe_id)
def test_gsm8k_recipe_sets_the_model_and_the_launch_command_in_its_header(path):
    data, args, model, _ = cli.parse("dapo", ["--config", str(path), *CPU])
    assert model.model_name_or_path.startswith("Qwen/") and data.task == "gsm8k"
    assert data.reward_funcs == ["math_answer_reward"] and args.bf16
    variant = path.stem.removeprefix("qwen2.5-1.5b")
    assert model.use_peft == (variant in ("-lora", "-qlora"))
    assert model.load_in_4bit == (variant == "-qlora")
    assert args.use_vllm == (variant == "-vllm") and (variant != "-vllm" or args.vllm_mode == "colocate")
    # the launch command in the header names an accelerate config that exists and this recipe
    header = path.read_text().split("\n\n", 1)[0]
    accelerate_config = header.split("--config_file ", 1)[1].split()[0]
    assert (ROOT / accelerate_config).is_file() and f"--config {path.relative_to(ROOT).as_posix()}" in header


def test_gsm8k_recipes_use_each_algorithms_paper_defaults():
    recipe = str(RECIPES / "gsm8k/qwen2.5-1.5b.yaml")
    _, dapo, _, _ = cli.parse("dapo", ["--config", recipe, *CPU])
    assert (dapo.epsilon, dapo.epsilon_high, dapo.loss_aggregation) == (0.2, 0.28, "token_mean")
    assert dapo.overlong_cache_length == round(0.2 * dapo.max_completion_length)
    _, cispo, _, _ = cli.parse("cispo", ["--config", recipe, *CPU])
    assert (cispo.policy_loss, cispo.epsilon_high) == ("cispo", 5.0)
    _, rloo, _, _ = cli.parse("rloo", ["--config", recipe, *CPU])
    assert (rloo.advantage_estimator, rloo.beta, rloo.kl_in_reward) == ("rloo", 0.05, True)


@pytest.mark.parametrize("path", GSM8K_RECIPES, ids=recipe_id)
def test_the_documented_per_preset_flags_override_the_recipe(path):
    readme = (RECIPES / "README.md").read_text()
    for name, flags in PRESET_FLAGS.items():
        assert f"trl-reasoning {name} --config recipes/gsm8k/qwen2.5-1.5b-lora.yaml {shlex.join(flags)}" in readme
        header = f"{preset(name).display_name}: add {shlex.join(flags)}"
        assert header in path.read_text()  # the recipe's header says it too
        _, args, _, _ = cli.parse(name, ["--config", str(path), *flags, *CPU])
        for flag, value in zip(flags[::2], flags[1::2]):
            assert getattr(args, flag.removeprefix("--")) == type(getattr(args, flag.removeprefix("--")))(value)
        assert args.output_dir.endswith(f"-{name}")
    # GSPO's and ProRL's four optimizer steps per rollout batch follow the recipe's gradient accumulation, unflagged
    for name in ("gspo", "prorl"):
        _, args, _, _ = cli.parse(name, ["--config", str(path), *PRESET_FLAGS.get(name, []), *CPU])
        assert args.gradient_accumulation_steps == 4
        assert args.steps_per_generation == 4 * args.gradient_accumulation_steps, name


@pytest.mark.parametrize("name", ["ddp", "zero2", "zero3", "fsdp2", "multi_node"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(RECIPES / "accelerate" / f"{name}.yaml"))
    expected = {
        "ddp": "MULTI_GPU",
        "zero2": "DEEPSPEED",
        "zero3": "DEEPSPEED",
        "fsdp2": "FSDP",
        "multi_node": "DEEPSPEED",
    }
    assert str(getattr(config.distributed_type, "value", config.distributed_type)) == expected[name]
    if name in ("zero2", "zero3"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
    if name == "fsdp2":
        assert config.fsdp_config["fsdp_version"] == 2
    if name == "multi_node":
        assert config.num_machines == 2 and config.main_process_ip and config.num_processes == 16
    readme = (RECIPES / "README.md").read_text()
    assert f"recipes/accelerate/{name}.yaml" in readme


def test_recipes_readme_has_the_launch_commands():
    readme = (RECIPES / "README.md").read_text()
    assert "accelerate launch --config_file recipes/accelerate/zero2.yaml -m trl_reasoning.cli dapo" in readme
    for path in TRAINING_RECIPES:  # every recipe is in the README's table, by folder and file
        variant = f"-{path.stem.rsplit('-', 1)[-1]}.yaml"
        assert f"`{path.parent.name}/`" in readme and (path.name in readme or variant in readme), path
    assert "trl-reasoning demo" in readme and "trl-reasoning eval" in readme


def test_every_recipe_file_the_recipes_name_exists():
    """A recipe's header or recipes/README.md naming a recipe that is not shipped (as demo.yaml once named a
    recipe that was never shipped) sends readers nowhere."""
    texts = {path: path.read_text() for path in [*RECIPES.glob("**/*.yaml"), RECIPES / "README.md"]}
    named = {(path, ref) for path, text in texts.items() for ref in re.findall(r"recipes/[\w./-]+\.yaml", text)}
    assert {ref for _, ref in named} >= {"recipes/demo.yaml", "recipes/arithmetic/smollm2-135m-cpu.yaml"}
    missing = [f"{path.relative_to(ROOT)}: {ref}" for path, ref in sorted(named) if not (ROOT / ref).is_file()]
    assert not missing, missing


def test_demo_recipe_parses():
    demo, args = cli.parse("demo", ["--config", str(RECIPES / "demo.yaml")])
    raw = yaml.safe_load((RECIPES / "demo.yaml").read_text())
    assert demo.algorithm == raw["algorithm"] == "dapo" and type(args).__name__ == "DAPOConfig"
    assert (args.max_steps, args.learning_rate, args.use_cpu) == (raw["max_steps"], raw["learning_rate"], True)
    assert demo.warm_start_steps == raw["warm_start_steps"] and demo.eval_k == raw["eval_k"]
    demo, args = cli.parse("demo", ["--config", str(RECIPES / "demo.yaml"), "--algorithm", "cispo"])
    assert demo.algorithm == "cispo" and type(args).__name__ == "CISPOConfig"


@pytest.mark.slow
def test_demo_recipe_runs_a_few_steps(tmp_path, capsys):
    result = cli.run(
        [
            "demo",
            "--config",
            str(RECIPES / "demo.yaml"),
            "--fast",
            "--warm_start_steps",
            "10",
            "--num_train",
            "64",
            "--num_test",
            "4",
            "--eval_num_samples",
            "2",
            "--eval_k",
            "2",
            "--eval_every",
            "0",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--cache_dir",
            str(tmp_path / "cache"),
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    assert result["algorithm"] == "dapo" and (tmp_path / "out" / "README.md").exists()
    assert "| warm start (SFT) |" in capsys.readouterr().out


def test_recipes_are_listed_and_copied_from_the_installed_package(tmp_path, capsys):
    listed = dict(cli.run(["recipes"]))
    shipped = {p.relative_to(RECIPES).as_posix() for p in RECIPES.glob("**/*.yaml")}
    assert set(listed) == shipped and listed["gsm8k/qwen2.5-1.5b.yaml"].startswith("GSM8K with Qwen")
    target = cli.run(["recipes", "--copy", str(tmp_path / "my-recipes")])
    assert {p.relative_to(target).as_posix() for p in target.glob("**/*.yaml")} == shipped
    _, args, _, _ = cli.parse("scalerl", ["--config", str(target / "gsm8k/qwen2.5-1.5b.yaml"), *CPU])
    assert type(args).__name__ == "ScaleRLConfig"
    with pytest.raises(SystemExit, match="exists and is not empty"):
        cli.run(["recipes", "--copy", str(target)])
