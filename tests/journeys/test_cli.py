"""Journey: the `trl-reasoning` command line, as a user runs it, from a local model folder and a local `train.jsonl`,
with a reward function from the user's own module (on PYTHONPATH). It trains past two checkpoints, is run again with
`--resume_from_checkpoint` (a restarted job) and finishes, and the saved model is then evaluated with
`trl-reasoning eval --num_processes 2` (two processes, each with half of the prompts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from journeys._helpers import checkpoint_global_step, checkpoint_steps
from trl_reasoning.models.tiny import save_tiny_model

MAX_STEPS = 5
REWARD_MODULE = '''
def digit_share(completions, **kwargs):
    """The share of digits in the completion (the user's own reward)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]
'''


#: Loaded by every launched process (on PYTHONPATH): at its exit, after all else, a rank records whether its process
#: group is still alive. One left alive can abort the rank at exit (SIGABRT in gloo's threads) after the model is saved.
EXIT_PROBE = """
import atexit
import os
import sys


def _record_process_group_at_exit():
    distributed = sys.modules.get("torch.distributed")
    alive = bool(distributed is not None and distributed.is_available() and distributed.is_initialized())
    with open(os.path.join(os.environ["EXIT_PROBE_DIR"], "rank" + os.environ["RANK"]), "w") as f:
        f.write("alive" if alive else "destroyed")


if "RANK" in os.environ and "EXIT_PROBE_DIR" in os.environ:
    atexit.register(_record_process_group_at_exit)  # registered first, so it runs after every other exit handler
"""


def _command() -> list[str]:
    script = Path(sys.executable).with_name("trl-reasoning")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "trl_reasoning.cli"]


def _run(arguments: list[str], workdir: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(_command() + arguments, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"{' '.join(arguments[:1])} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def _training_logs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("{'loss'")]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-journey")
    model_dir = save_tiny_model(root / "my-tiny-model", seed=0)
    data_file = root / "data" / "train.jsonl"
    data_file.parent.mkdir()
    with data_file.open("w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"{i}+{i * 7 % 10}="}]}) + "\n")
    user_code = root / "user_code"
    user_code.mkdir()
    (user_code / "my_rewards.py").write_text(REWARD_MODULE)
    (user_code / "sitecustomize.py").write_text(EXIT_PROBE)  # active only where EXIT_PROBE_DIR is set: the eval
    eval_exit_probe = root / "eval_exit_probe"
    eval_exit_probe.mkdir()
    workdir = root / "workdir"  # not the module's folder: the reward module is found through PYTHONPATH
    workdir.mkdir()
    output_dir = root / "runs" / "digits-dapo"
    env = {
        **os.environ,
        "PYTHONPATH": str(user_code),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(root / "datasets-cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    train_args = [
        "dapo",
        "--model_name_or_path", str(model_dir),
        "--dataset_name", str(data_file),
        "--reward_funcs", "my_rewards.digit_share",
        "--output_dir", str(output_dir),
        "--max_steps", str(MAX_STEPS),
        "--save_strategy", "steps",
        "--save_steps", "2",
        "--per_device_train_batch_size", "8",
        "--num_generations", "4",
        "--max_completion_length", "8",
        "--learning_rate", "1e-2",
        "--logging_steps", "1",
        "--use_cpu", "true",
        "--bf16", "false",
        "--gradient_checkpointing", "false",
        "--report_to", "none",
        "--disable_tqdm", "true",
        "--seed", "0",
        "--async_rollouts", "true",  # the pipeline through the CLI, past checkpoints and a resume
        "--max_staleness", "2",
    ]  # fmt: skip
    first = _run(train_args, workdir, env)
    first_files = sorted(p.name for p in output_dir.iterdir())
    first_card = (output_dir / "README.md").read_text()
    first_state = json.loads((output_dir / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())

    # The restarted job: what it must write again is removed first.
    shutil.rmtree(output_dir / f"checkpoint-{MAX_STEPS}")
    for name in ("model.safetensors", "README.md"):
        (output_dir / name).unlink()
    resumed = _run(train_args + ["--resume_from_checkpoint", str(output_dir / "checkpoint-4")], workdir, env)

    metrics_file = root / "metrics.json"
    evaluation = _run(
        [
            "eval",
            "--model_name_or_path", str(output_dir),
            "--dataset_name", str(data_file),
            "--split", "train",
            "--reward_funcs", "my_rewards.digit_share",
            "--num_samples", "2",
            "--ks", "1", "2",
            "--max_new_tokens", "8",
            "--success_threshold", "0.5",
            "--output_json", str(metrics_file),
            "--num_processes", "2",  # each process evaluates half of the prompts
            "--use_cpu", "true",
        ],
        workdir,
        {**env, "EXIT_PROBE_DIR": str(eval_exit_probe)},
    )  # fmt: skip
    return {
        "output_dir": output_dir,
        "model_dir": model_dir,
        "data_file": data_file,
        "first": first,
        "first_files": first_files,
        "first_card": first_card,
        "first_state": first_state,
        "resumed": resumed,
        "evaluation": evaluation,
        "metrics_file": metrics_file,
        "eval_exit_probe": eval_exit_probe,
    }


@pytest.mark.journey
@pytest.mark.slow
def test_cli_trains_from_local_files_past_checkpoints(cli_run):
    output_dir = cli_run["output_dir"]
    logs = _training_logs(cli_run["first"].stdout)
    assert len(logs) == MAX_STEPS, cli_run["first"].stdout[-2000:]
    assert all("'rewards/digit_share/mean'" in line for line in logs)  # the user's reward, by its name
    assert cli_run["first_state"]["global_step"] == MAX_STEPS
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(cli_run["first_files"])
    assert "Trained with **DAPO**" in cli_run["first_card"]
    assert {2, 4, MAX_STEPS} <= set(checkpoint_steps(output_dir))


@pytest.mark.journey
@pytest.mark.slow
def test_cli_resumes_from_a_checkpoint_and_finishes(cli_run):
    output_dir = cli_run["output_dir"]
    resumed = cli_run["resumed"]
    assert len(_training_logs(resumed.stdout)) == 1, resumed.stdout[-2000:]  # step 5 only
    assert f"Model and model card saved to {output_dir}" in resumed.stdout
    assert checkpoint_global_step(output_dir / f"checkpoint-{MAX_STEPS}") == MAX_STEPS
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "README.md").is_file()
    state = json.loads((output_dir / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == MAX_STEPS
    # Same step 5 as the uninterrupted run.
    first_losses = [entry["loss"] for entry in cli_run["first_state"]["log_history"] if "loss" in entry]
    assert losses[-1] == pytest.approx(first_losses[-1], rel=1e-4, abs=1e-6)


@pytest.mark.journey
@pytest.mark.slow
def test_cli_evaluates_the_saved_model(cli_run):
    metrics = json.loads(cli_run["metrics_file"].read_text())
    assert set(metrics) >= {"pass@1", "pass@2", "accuracy", "reward", "mean_length"}
    assert metrics["num_prompts"] == 8 and metrics["num_samples"] == 2
    assert 0.0 <= metrics["pass@1"] <= metrics["pass@2"] <= 1.0
    assert "| pass@2 |" in cli_run["evaluation"].stdout
    # Two processes, the 8 prompts split between them (the main process's bar counts its 4), one table printed.
    assert cli_run["evaluation"].stdout.count("| pass@2 |") == 1
    assert "[train] (2 processes)" in cli_run["evaluation"].stdout
    assert "pass@k eval (8 prompts x 2 samples, 2 processes)" in cli_run["evaluation"].stderr
    assert "4/4" in cli_run["evaluation"].stderr


def _card_title(card: str) -> str:
    return next(line for line in card.splitlines() if line.startswith("# Model Card for "))


@pytest.mark.journey
@pytest.mark.slow
def test_cli_model_card_names_the_model(cli_run):
    card = (cli_run["output_dir"] / "README.md").read_text()
    title = _card_title(card)
    assert title.removeprefix("# Model Card for ").strip() not in ("", "None"), title
    assert "Rollouts: asynchronous, with a deterministic staleness bound of k = 2" in card


@pytest.mark.journey
@pytest.mark.slow
def test_cli_trains_asynchronously_and_resumes_the_pipeline(cli_run):
    """`--async_rollouts true --max_staleness 2`: steps 1-2 sampled by fewer steps' lag, then 2; the resumed job
    (from checkpoint-4) continues at the bound, from the checkpoint's behaviour weights."""
    for run in ("first", "resumed"):
        logs = _training_logs(cli_run[run].stdout)
        staleness = [float(line.split("'async/staleness': '")[1].split("'")[0]) for line in logs]
        assert staleness == ([0, 1, 2, 2, 2] if run == "first" else [2]), staleness
    assert (cli_run["output_dir"] / "checkpoint-4" / "trl_reasoning_behaviour_weights.pt").is_file()


@pytest.mark.journey
@pytest.mark.slow
def test_cli_model_card_does_not_link_a_local_data_file_to_the_hub(cli_run):
    card = (cli_run["output_dir"] / "README.md").read_text()
    data_file = str(cli_run["data_file"])
    assert f"huggingface.co/datasets/{data_file}" not in card
    assert f"datasets: {data_file}" not in card


@pytest.mark.journey
@pytest.mark.slow
def test_cli_launches_two_processes_from_a_yaml_recipe(tmp_path):
    """`--num_processes 2` launches through accelerate as `trl grpo` does (two gloo processes on a CPU), and a YAML
    `reward_funcs: module.fn` (one string) is one reward function."""
    model_dir = save_tiny_model(tmp_path / "model", seed=0)
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(8)))
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "my_rewards.py").write_text(REWARD_MODULE)
    (user_code / "sitecustomize.py").write_text(EXIT_PROBE)
    exit_probe = tmp_path / "exit_probe"
    exit_probe.mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "reward_funcs: my_rewards.digit_share\nmax_steps: 2\nper_device_train_batch_size: 4\nnum_generations: 4\n"
        "max_completion_length: 8\nuse_cpu: true\nbf16: false\ngradient_checkpointing: false\nreport_to: none\n"
        "logging_steps: 1\n"
    )
    env = {**os.environ, "PYTHONPATH": str(user_code), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["EXIT_PROBE_DIR"] = str(exit_probe)
    output_dir = tmp_path / "runs" / "two-processes"
    arguments = ["dapo", "--config", str(recipe), "--num_processes", "2", "--model_name_or_path", str(model_dir)]
    arguments += ["--dataset_name", str(data_file), "--output_dir", str(output_dir)]
    result = _run(arguments, tmp_path, env)
    assert f"saved to {output_dir} (2 processes)" in result.stdout
    logs = _training_logs(result.stdout)
    assert len(logs) == 2 and all("'rewards/digit_share/mean'" in line for line in logs)
    card = (output_dir / "README.md").read_text()
    assert "# Model Card for two-processes" in card
    # Both ranks destroyed their process group before exiting (a live gloo group can abort a rank at exit).
    assert {p.name: p.read_text() for p in exit_probe.iterdir()} == {"rank0": "destroyed", "rank1": "destroyed"}


@pytest.mark.journey
@pytest.mark.slow
def test_cli_eval_on_two_processes_leaves_no_process_group_alive_at_exit(cli_run):
    """`eval --num_processes 2` ends as training does: each rank destroys its gloo group before it exits."""
    probe = cli_run["eval_exit_probe"]
    assert {p.name: p.read_text() for p in probe.iterdir()} == {"rank0": "destroyed", "rank1": "destroyed"}
