"""Shared fixtures: a tiny offline Qwen2 model + character tokenizer, a toy prompt dataset, CPU training args."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from _launch import run_torchrun as launch_two_processes  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl_reasoning as tr  # noqa: E402
from trl_reasoning.models.tiny import cpu_config_kwargs, save_tiny_model  # noqa: E402
from trl_reasoning.tasks.digit_reversal import digit_reward  # noqa: E402

BENCH = Path(__file__).parents[1] / "bench"


def load_bench_script(name: str):
    """A fresh module of ``bench/<name>.py`` (not the cached import: a test that changes its globals leaves the next
    test's copy untouched). Only the tests of the bench scripts (``test_bench_*.py``) call it: it puts ``bench/`` on
    ``sys.path``, where the scripts import their shared modules (``_common``, ``_results``) from; the rest of the
    suite imports nothing from ``bench/``."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Set by pytest-xdist in its workers ("gw0", "gw1", ...); None in a plain pytest run.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER is not None:
    # The README's command runs one worker per core: one intra-op thread each, not a core's worth each (tiny models
    # gain ~10% from a second thread, two workers ~1.7x).
    torch.set_num_threads(1)


def cpu_args(**overrides) -> dict:
    """Keyword arguments that make a TRL/trl-reasoning config run fast and deterministically on a CPU."""
    args = cpu_config_kwargs(
        output_dir=overrides.pop("output_dir", f"/tmp/trl-reasoning-tests-{XDIST_WORKER or 'main'}"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        seed=0,
        dataloader_num_workers=0,
    )
    args.update(overrides)
    return args


def run_torchrun(worker: Path, *arguments: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``worker arguments...`` under ``torchrun`` with two gloo processes (``run_torchrun`` of
    ``tests/_launch.py``: a free local port, offline, one thread per process); fails the test with both outputs' tails
    when it exits non-zero. ``tests/`` is on the workers' path (they import ``conftest``)."""
    pythonpath = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    result = launch_two_processes(str(worker), list(arguments), env={"PYTHONPATH": pythonpath}, timeout=timeout)
    assert result.returncode == 0, (
        f"{worker.name} {' '.join(arguments)} failed:\n{result.stdout[-3000:]}\n" + (result.stderr[-6000:])
    )
    return result


def make_prompts(n: int = 16) -> Dataset:
    """Conversational prompts of varied lengths."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i * 7 % 10}="}]} for i in range(n)])


#: A dense reward in [0, 1]: the fraction of the completion's characters that are digits (the demo's task).
digit_fraction = digit_reward


def has_digit(completions, **kwargs) -> list[float]:
    """A binary reward: 1 if the completion contains a digit (about half of a random tiny model's completions)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in t)) for t in texts]


def generate_batch(trainer, seed: int = 123) -> dict:
    """One scored generation batch, as TRL builds it in `_prepare_inputs` (before the shuffle)."""
    dataset = make_prompts()
    group = trainer.num_generations
    batch = [dataset[i] for i in range(trainer.args.per_device_train_batch_size // group) for _ in range(group)]
    trainer.model.train()
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(batch)


def logps_under(model, weights, prompt_ids, completion_ids, temperature) -> list[torch.Tensor]:
    """Independent recomputation of sampled tokens' log-probs with ``weights`` loaded into ``model``: each sequence
    alone, no padding, float64 log-softmax."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in weights:
                param.copy_(weights[name])
        rows = []
        for prompt, completion in zip(prompt_ids, completion_ids, strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
            rows.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0])
    return rows


def message_text(message) -> str:
    """The text of a prompt or completion, conversational (the last message's content) or plain."""
    return message[-1]["content"] if isinstance(message, list) else message


def logged_metric(trainer, name) -> list[float]:
    """Every logged value of ``name``, in order."""
    return [entry[name] for entry in trainer.state.log_history if name in entry]


def preset_id(entry: tr.Preset) -> str:
    """A preset's name in test ids: its config class without `Config` (`DrGRPO`), as docs/RELIABILITY.md cites them."""
    return entry.config_class.__name__.removesuffix("Config")


def steps_per_rollout(config_cls: type) -> int:
    """The optimizer steps one rollout batch feeds under a config's defaults (`gradient_accumulation_steps=1`, as in
    `cpu_args`): GSPO's `steps_per_generation=4` (the paper's four minibatches), 1 for the other presets."""
    return config_cls.__dataclass_fields__["steps_per_generation"].default or 1


def preset_reward(entry: tr.Preset):
    """The reward the tests train a preset with: MaxRL's estimator divides by the group's success rate, so its reward
    must be binary (`has_digit`); every other preset gets the graded `digit_fraction`."""
    return has_digit if entry.defaults()["advantage_estimator"] == "maxrl" else digit_fraction


#: Every preset of `trl_reasoning.PRESETS`: id -> (trainer class, config class, reward function).
PRESETS = {preset_id(entry): (entry.trainer_class, entry.config_class, preset_reward(entry)) for entry in tr.PRESETS}


def lora_config():
    """The LoRA adapters every LoRA/QLoRA test trains."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


class StopAt(TrainerCallback):
    """Saves a checkpoint and stops at ``step``, as an interrupted job would (same max_steps, so the same schedule)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


class Recorder(TrainerCallback):
    """Keeps what each training batch was built from, read from the trainer's public ``last_train_batch`` after every
    optimizer step: the gathered rewards, the active groups, the advantages and this process's loss weights."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.batches = []
        self._seen = None
        trainer.add_callback(self)

    def on_step_end(self, args, state, control, **kwargs):
        batch = self.trainer.last_train_batch
        if batch is not None and batch is not self._seen:
            self._seen = batch
            self.batches.append(
                {
                    "rewards": batch.rewards,
                    "active": batch.active_groups,
                    "weights": batch.loss_weights,
                    "advantages": batch.advantages,
                }
            )


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0))


@pytest.fixture(scope="session")
def tiny_untied_model_path(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-untied"), seed=0, tie_word_embeddings=False))


@pytest.fixture
def prompts() -> Dataset:
    return make_prompts()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tool_calling_model(tmp_path: Path) -> tuple[str, object]:
    """The tiny model with room for TRL's tool section in the prompt, and its tokenizer with a template that renders
    tool calls (passed in memory: the character tokenizer is the one that keeps whitespace, which the template's
    parser needs)."""
    import json

    from trl.chat_template_utils import qwen2_5_chat_template

    from trl_reasoning.models.tiny import build_tokenizer

    path = save_tiny_model(tmp_path / "tool-model", seed=0)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    tokenizer = build_tokenizer()
    tokenizer.chat_template = qwen2_5_chat_template
    return str(path), tokenizer


def scored_batches(trainer) -> tuple[list[dict], list[dict]]:
    """Every batch ``trainer.train()`` scores, and the trainable weights at the beginning of every optimizer step."""
    from transformers import TrainerCallback

    batches, weights_at_step = [], []
    score = trainer._generate_and_score_completions

    def scored(inputs):
        batches.append(score(inputs))
        return batches[-1]

    class WeightsAtStepBegin(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            weights_at_step.append({k: v.detach().clone() for k, v in model.named_parameters()})

    trainer._generate_and_score_completions = scored
    trainer.add_callback(WeightsAtStepBegin())
    return batches, weights_at_step


def unpadded_rows(batch: dict, key: str, mask_key: str) -> list[list[int]]:
    """The unpadded rows of ``batch[key]`` (``mask_key`` marks the real tokens)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(batch[key], batch[mask_key], strict=True)]
