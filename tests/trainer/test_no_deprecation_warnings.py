"""The main job's own calls emit no DeprecationWarning or FutureWarning.

pyproject's pytest settings ignore both categories everywhere (the libraries below us emit many); these tests record
them themselves, with the call stack, and fail on those our code causes: a deprecated argument in the configs the
main job and the CPU recipes build, or a deprecated API that trl-reasoning calls (the first frame outside the
library that warns is in trl_reasoning/). A deprecated call that TRL makes inside its own code (TRL 1.16 reads
`is_gradient_checkpointing` when it unwraps a model for generation) is TRL's, and is not counted.
"""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import pytest
from datasets import Dataset

import trl_reasoning
from trl_reasoning import DAPOConfig, DAPOTrainer
from trl_reasoning.models.loading import load_tokenizer
from trl_reasoning.models.tiny import cpu_config_kwargs
from trl_reasoning.tasks.digit_reversal import digit_reward

PACKAGE_DIR = str(Path(trl_reasoning.__file__).resolve().parent) + "/"
RECIPES = Path(__file__).resolve().parents[2] / "recipes"
DEPRECATIONS = (DeprecationWarning, FutureWarning)


class DeprecationRecorder:
    """Records every DeprecationWarning/FutureWarning issued through `warnings.warn` with its call stack, whatever
    the warning filters say (pytest's settings ignore these categories)."""

    def __init__(self):
        self.records: list[tuple[str, list[traceback.FrameSummary]]] = []
        self._original = warnings.warn

    def __enter__(self) -> DeprecationRecorder:
        original = self._original

        def recording_warn(message, category=None, stacklevel=1, source=None, **kwargs):
            kind = category or (type(message) if isinstance(message, Warning) else UserWarning)
            if isinstance(kind, type) and issubclass(kind, DEPRECATIONS):
                self.records.append((str(message), traceback.extract_stack()[:-1]))
            return original(message, category, stacklevel + 1, source, **kwargs)

        warnings.warn = recording_warn
        return self

    def __exit__(self, *exc) -> None:
        warnings.warn = self._original

    def ours(self) -> list[str]:
        """The recorded warnings that trl_reasoning's own code caused: issued in trl_reasoning/, or by a library
        called directly from it (the first frame outside the warning's library is ours)."""
        found = []
        for message, stack in self.records:
            caller = _first_frame_outside_the_warning_library(stack)
            if caller is not None and caller.filename.startswith(PACKAGE_DIR):
                found.append(f"{message} (called at {caller.filename}:{caller.lineno})")
        return sorted(set(found))

    def all(self) -> list[str]:
        return sorted({message for message, _ in self.records})


def _library_root(filename: str) -> str:
    """The folder of the installed package (or the standard library) that `filename` belongs to."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            head, _, tail = filename.partition(marker)
            return head + marker + tail.split("/", 1)[0]
    return filename if filename.startswith(PACKAGE_DIR) else str(Path(filename).parent)


def _first_frame_outside_the_warning_library(stack: list[traceback.FrameSummary]):
    """Walking out from the `warnings.warn` call, the first frame of another package (``contextlib`` and other
    standard-library plumbing skipped); the warning's own frame when it is trl_reasoning's."""
    site = stack[-1]
    if site.filename.startswith(PACKAGE_DIR):
        return site
    library = _library_root(site.filename)
    stdlib = str(Path(traceback.__file__).parent)
    for frame in reversed(stack[:-1]):
        root = _library_root(frame.filename)
        if root == library or root == stdlib or frame.filename.startswith("<"):
            continue
        return frame
    return None


def test_the_recorder_blames_our_calls_and_not_the_libraries():
    """The rule itself: a deprecated call made from trl_reasoning counts, the same call made by a library does not."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
        )
    )
    from trl_reasoning.utils import checkpointing

    with DeprecationRecorder() as recorder:
        checkpointing.is_activation_checkpointing(model)
    assert recorder.ours() == []
    # the deprecated alias, called from a function compiled as if it lived in trl_reasoning/
    code = compile("model.is_gradient_checkpointing", PACKAGE_DIR + "utils/checkpointing.py", "eval")
    with DeprecationRecorder() as recorder:
        eval(code, {"model": model})
    assert [m for m in recorder.ours() if "is_gradient_checkpointing" in m], recorder.all()
    # the same alias read from here (a test, not the package) is not ours
    with DeprecationRecorder() as recorder:
        model.is_gradient_checkpointing  # noqa: B018
    assert recorder.all() and recorder.ours() == []


@pytest.mark.filterwarnings("always::FutureWarning", "always::DeprecationWarning")
def test_the_main_jobs_configs_use_no_deprecated_argument(tmp_path):
    """The configs the main job (real and tiny), its warm start and the CPU recipes build: no deprecation at all
    (`gradient_checkpointing` is `activation_checkpointing` in the installed transformers)."""
    from trl import SFTConfig

    from trl_reasoning import cli

    with DeprecationRecorder() as recorder, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.parse("demo", ["--output_dir", str(tmp_path / "real")])
        cli.parse("demo", ["--fast", "--output_dir", str(tmp_path / "tiny")])
        SFTConfig(**cpu_config_kwargs(output_dir=str(tmp_path / "sft")))
        for recipe in ("reverse/tiny-cpu.yaml", "arithmetic/smollm2-135m-cpu.yaml"):
            cli.parse("dapo", ["--config", str(RECIPES / recipe), "--output_dir", str(tmp_path / "recipe")])
    assert recorder.all() == []
    assert [str(w.message) for w in caught if issubclass(w.category, DEPRECATIONS)] == []


def test_a_short_training_run_calls_no_deprecated_api(tiny_model_path, tmp_path):
    """Two steps of DAPO on the tiny model, with the pass@k callback of the main job: none of the deprecation
    warnings raised on the way comes from a call of ours."""
    from trl_reasoning.evaluation.callbacks import PassAtKCallback

    with DeprecationRecorder() as recorder:
        args = DAPOConfig(
            **cpu_config_kwargs(output_dir=str(tmp_path / "out")),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            max_steps=2,
            dynamic_sampling=False,
        )
        rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(8)]
        trainer = DAPOTrainer(
            model=tiny_model_path,
            reward_funcs=digit_reward,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=load_tokenizer(tiny_model_path),
        )
        trainer.add_callback(
            PassAtKCallback(
                trainer,
                Dataset.from_list(rows[:2]),
                digit_reward,
                eval_steps=1,
                num_samples=2,
                ks=(1,),
                max_new_tokens=4,
            )
        )
        trainer.train()
        trainer.save_model(str(tmp_path / "out"))
        trainer.create_model_card(model_name="out")
    assert recorder.ours() == [], recorder.ours()
