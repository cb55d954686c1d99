"""trl-reasoning overrides TRL private methods: a TRL upgrade that moves them must fail loudly, by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import trl
from _trl_sources import assigned as _assigned
from _trl_sources import trl_names as _trl_names
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOTrainer

import trl_reasoning as tr
from trl_reasoning.trainer import base as seam
from trl_reasoning.trainer import trl_api


def test_installed_trl_has_every_private_method_we_rely_on():
    trl_api.check_trl_private_api(GRPOTrainer)


def test_every_override_is_listed():
    """Each private GRPOTrainer method that ReasoningTrainer redefines is in TRL_PRIVATE_API (and nothing else)."""
    overridden = {
        name
        for name, value in vars(seam.ReasoningTrainer).items()
        if callable(value) and name.startswith("_") and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert overridden == {
        "_calculate_rewards",
        "_generate_and_score_completions",
        "_compute_loss",
        "_get_train_sampler",
        "_save_checkpoint",
        "_load_optimizer_and_scheduler",
        "_generate",
        "_generate_single_turn",
        "_get_per_token_logps_and_entropies",
        "_prepare_inputs",
    }
    assert overridden <= set(trl_api.TRL_PRIVATE_API)


@pytest.mark.parametrize("name", list(trl_api.TRL_PRIVATE_API))
def test_a_removed_method_is_named(name):
    Missing = type("Missing", (), {k: getattr(GRPOTrainer, k) for k in trl_api.TRL_PRIVATE_API if k != name})
    with pytest.raises(trl_api.TRLCompatibilityError, match=rf"Missing\.{name} no longer exists"):
        trl_api.check_trl_private_api(Missing)


def test_a_changed_signature_is_named():
    class Changed(GRPOTrainer):
        def _compute_loss(self, model, batch, extra=None):  # `inputs` renamed
            return None

    with pytest.raises(trl_api.TRLCompatibilityError, match=r"Changed\._compute_loss takes \(model, batch, extra\)"):
        trl_api.check_trl_private_api(Changed)


def test_supported_range_matches_pyproject_and_installed_trl():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if re.match(r"trl\b", d))
    spec = SpecifierSet(pin[len("trl") :])
    low, high = trl_api.SUPPORTED_TRL
    assert spec == SpecifierSet(f">={low},<{high}")
    assert Version(trl.__version__) in spec
    assert Version(trl_api.TRL_CHECKED_VERSION) in spec


def test_unsupported_trl_version_warns(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "2.0.0")
    with pytest.warns(UserWarning, match=r"trl-reasoning supports trl>=1\.16\.0,<1\.17\.0, but trl 2\.0\.0"):
        trl_api.warn_if_trl_unsupported()


def test_a_changed_trl_helper_function_is_named(monkeypatch):
    import trl.trainer.utils as trl_utils

    def add_fused_lm_head(model, temperature=1.0, outputs=("log_probs",)):  # cast_lm_head_to_fp32 dropped
        return None

    monkeypatch.setattr(trl_utils, "add_fused_lm_head", add_fused_lm_head)
    with pytest.raises(trl_api.TRLCompatibilityError, match=r"trl\.trainer\.utils\.add_fused_lm_head takes"):
        trl_api.check_trl_private_api(GRPOTrainer)


def test_a_removed_transformers_generation_method_is_named(monkeypatch):
    """The sampler's log-probs come from a processor added to the list ``_get_logits_processor`` builds: a
    transformers release without it must fail loudly when a trainer is built, not fall back in silence."""
    from transformers.generation.utils import GenerationMixin

    monkeypatch.delattr(GenerationMixin, "_get_logits_processor")
    with pytest.raises(
        trl_api.TRLCompatibilityError, match=r"GenerationMixin\._get_logits_processor no longer exists"
    ):
        trl_api.check_trl_private_api(GRPOTrainer)


def test_the_fused_head_outputs_are_trls():
    """The PEFT FP32-head path rebuilds TRL's fused LM head with TRL's own arguments: read them from TRL's source."""
    import inspect

    source = inspect.getsource(GRPOTrainer.__init__)
    assert f"outputs={trl_api.TRL_FUSED_LM_HEAD_OUTPUTS!r}" in source.replace('"', "'"), (
        "GRPOTrainer.__init__ no longer asks its fused LM head for "
        f"{trl_api.TRL_FUSED_LM_HEAD_OUTPUTS}: update TRL_FUSED_LM_HEAD_OUTPUTS"
    )


# ---------------------------------------------------------------- TRL's own tests, run against every preset
# TRL 1.16's tests/test_grpo_trainer.py, reproduced here the way TRL's tests do them (its files are not installed).


def _trainer_without_init(trainer_class):
    """A trainer built as TRL's rollout-dispatch tests build one: ``object.__new__``, then only the state TRL's
    ``_generate`` reads before it calls ``rollout_func``."""
    from types import SimpleNamespace
    from unittest.mock import MagicMock

    import torch

    trainer = object.__new__(trainer_class)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
    trainer.args = SimpleNamespace(report_to=[])
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=2)
    trainer._last_loaded_step = 1
    trainer.use_vllm = False
    trainer.use_transformers_paged = False
    trainer.vllm_generation = SimpleNamespace(sync_weights=MagicMock())
    return trainer


_PRESET_TRAINERS = ["ReasoningTrainer", *(entry.trainer_class.__name__ for entry in tr.PRESETS)]


@pytest.mark.parametrize("trainer_name", _PRESET_TRAINERS)
def test_generate_rollout_func_raises_when_required_keys_are_missing(trainer_name):
    """TRL's test of the same name (was: ``AttributeError: ... has no attribute 'async_rollouts'`` from the
    ``_generate`` override on a trainer built without ``__init__``)."""
    from unittest.mock import MagicMock

    import trl_reasoning as tr

    trainer = _trainer_without_init(getattr(tr, trainer_name))
    trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]]})
    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer._generate(["prompt"])
    trainer.rollout_func.assert_called_once_with(["prompt"], trainer)

    # with vLLM, TRL syncs the weights before calling rollout_func: the override leaves that to TRL too
    trainer.use_vllm = True
    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer._generate(["prompt"])
    trainer.vllm_generation.sync_weights.assert_called_once()
    assert trainer._last_loaded_step == trainer.state.global_step


def test_the_sampler_override_is_trls_on_a_trainer_built_without_init():
    """The audit of the other overrides: on a trainer built without ``__init__`` (no trl-reasoning state), the sampler
    override gives TRL's own ``RepeatSampler`` instead of failing on ``self.rollout``."""
    from types import SimpleNamespace

    import trl_reasoning as tr

    trainer = _trainer_without_init(tr.DAPOTrainer)
    assert "rollout" not in vars(trainer) and "async_rollouts" not in vars(trainer)
    trainer.args = SimpleNamespace(should_save=True, generation_batch_size=4, steps_per_generation=1, seed=0)
    trainer.num_generations, trainer.num_iterations, trainer.shuffle_dataset = 2, 1, True
    sampler = trainer._get_train_sampler(list(range(6)))
    assert type(sampler).__name__ == "RepeatSampler"  # TRL's own


@pytest.mark.parametrize("filter_overlong_prompts", [True, False], ids=["filtering", "not_filtering"])
def test_init_with_eval_dataset_iterable_dataset(filter_overlong_prompts, tiny_model_path, tmp_path):
    """TRL's ``test_init_with_eval_dataset[iterable_dataset]``: a streaming eval set stays the user's object (was:
    replaced by a filtered copy, even with ``filter_overlong_prompts=False``)."""
    from conftest import cpu_args, digit_fraction, make_prompts
    from datasets import IterableDataset

    import trl_reasoning as tr

    rows = [{"prompt": f"{i}+{i}="} for i in range(8)]
    eval_dataset = IterableDataset.from_generator(lambda: iter(rows))
    for trainer_class in (tr.ReasoningTrainer, tr.DAPOTrainer):
        args = trainer_class.config_class(
            **cpu_args(output_dir=str(tmp_path), filter_overlong_prompts=filter_overlong_prompts)
        )
        trainer = trainer_class(
            model=tiny_model_path,
            reward_funcs=digit_fraction,
            args=args,
            train_dataset=make_prompts(),
            eval_dataset=eval_dataset,
        )
        assert trainer.eval_dataset is eval_dataset


@pytest.mark.parametrize("as_dict", [False, True], ids=["stream", "dict_of_streams"])
def test_an_overlong_prompt_of_a_streamed_eval_dataset_is_still_skipped_by_name(as_dict, tiny_model_path, tmp_path):
    """Kept as the user's object, a streamed eval set is still read through the context check: the overlong prompt
    (505 tokens: it fits the context of 512 alone, not with max_completion_length=12) is skipped with a warning that
    names its row, once however many evaluations read the stream."""
    import warnings

    from conftest import cpu_args, digit_fraction, make_prompts
    from datasets import IterableDataset

    import trl_reasoning as tr

    rows = [{"prompt": f"{i}+{i}="} for i in range(7)]
    rows.insert(3, {"prompt": "7" * 505})
    stream = IterableDataset.from_generator(lambda: iter(rows))
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), per_device_eval_batch_size=4))
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(),
        eval_dataset={"arith": stream} if as_dict else stream,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            trainer.evaluate("arith" if as_dict else None)
    skipped = [str(w.message) for w in caught if "(505 tokens" in str(w.message)]
    split = "eval_dataset['arith']" if as_dict else "eval_dataset"
    assert len(skipped) == 1, skipped
    assert f"row 3 of the streamed {split} (505 tokens" in skipped[0] and "skipped" in skipped[0]


# ---------------------------------------------------------------- the rollout parts' protocols and the TRL guard


def _host_protocols():
    from trl_reasoning.async_rollouts import protocols
    from trl_reasoning.trainer.rollout import RolloutHost

    return {
        RolloutHost: trl_api.TRL_INSTANCE_ATTRIBUTES,
        protocols.AsyncRolloutHost: trl_api.TRL_INSTANCE_ATTRIBUTES,
        protocols.VLLMBackendHost: trl_api.TRL_VLLM_INSTANCE_ATTRIBUTES,
        protocols.GenerateBackendHost: trl_api.TRL_GENERATE_INSTANCE_ATTRIBUTES,
    }


def _trl_protocol_members() -> list[str]:
    from trl_reasoning.async_rollouts.protocols import protocol_members

    trl_names = _trl_names()
    return sorted({name for protocol in _host_protocols() for name in protocol_members(protocol) if name in trl_names})


def test_every_protocol_member_is_the_trainers_own_the_trainer_classes_or_guarded():
    """A member of a rollout part's protocol either comes from TRL's GRPOTrainer and is in the guard list of its
    backend, or is transformers' Trainer's, or trl-reasoning's trainer defines it."""
    import inspect

    import transformers

    from trl_reasoning.async_rollouts.protocols import protocol_members

    trl_names = _trl_names()
    trainer_names = _assigned(inspect.getsource(transformers.Trainer)) | set(dir(transformers.Trainer))
    own_classes = [k for k in seam.ReasoningTrainer.__mro__ if k.__module__.startswith("trl_reasoning")]
    own = {name for k in own_classes for name in vars(k)} | {
        name for k in own_classes for name in _assigned(inspect.getsource(k))
    }
    for protocol, guarded in _host_protocols().items():
        for name in protocol_members(protocol):
            if name in trl_names:
                assert name in guarded, f"{protocol.__name__}.{name} comes from TRL and is not in its guard list"
            else:
                assert name in trainer_names or name in own, f"{protocol.__name__}.{name}: nobody sets it"
    assert len(_trl_protocol_members()) >= 20, "the protocols name TRL's state: the check above is not vacuous"


def test_the_protocols_name_exactly_what_the_rollout_parts_read():
    """Every ``host.X`` of the rollout parts is a member of their protocol, and every member is read somewhere."""
    from trl_reasoning.async_rollouts import protocols
    from trl_reasoning.async_rollouts.protocols import protocol_members
    from trl_reasoning.trainer.rollout import RolloutHost

    package = Path(seam.__file__).parents[1]
    parts = {
        RolloutHost: [package / "trainer" / "rollout.py"],
        protocols.AsyncRolloutHost: sorted((package / "async_rollouts").glob("*.py")),
    }
    backends = protocols.VLLMBackendHost, protocols.GenerateBackendHost, protocols.EnvironmentHost
    for protocol, files in parts.items():
        read = set()
        for path in files:
            read |= set(re.findall(r"\bhost\.(\w+)", path.read_text()))
            read |= set(re.findall(r"getattr\(host, \"(\w+)\"", path.read_text()))
        named = set(protocol_members(protocol))
        if protocol is protocols.AsyncRolloutHost:
            named |= {name for backend in backends for name in protocol_members(backend)}
            named.add(trl_api.TRL_BATCH_ENVIRONMENTS)  # set by TRL per batch, not in __init__: guarded in its source
        assert read - named == set(), f"read but not in {protocol.__name__}"
        assert named - read == set(), f"in {protocol.__name__} but never read"


def test_every_trl_attribute_the_package_reads_or_writes_is_guarded():
    """``self.X`` in the trainer's classes and ``host.X`` / ``trainer.X`` anywhere in the package, where ``X`` is an
    attribute TRL's GRPOTrainer sets: each is in TRL_INSTANCE_ATTRIBUTES or its backend's list."""
    package = Path(seam.__file__).parents[1]
    trainer_files = {"trainer/base.py", "trainer/topk_forward.py", "models/model_card.py"}
    touched = {}
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        text = path.read_text()
        receivers = (
            r"self|host|trainer" if relative in trainer_files or relative.startswith("presets/") else r"host|trainer"
        )
        for name in re.findall(rf"\b(?:{receivers})\.(\w+)", text):
            touched.setdefault(name, set()).add(relative)
    guarded = set(
        trl_api.TRL_INSTANCE_ATTRIBUTES
        + trl_api.TRL_VLLM_INSTANCE_ATTRIBUTES
        + trl_api.TRL_GENERATE_INSTANCE_ATTRIBUTES
        + trl_api.TRL_ENVIRONMENT_ATTRIBUTES
        + (trl_api.TRL_BATCH_ENVIRONMENTS,)
    )
    trl_names = _trl_names()
    unguarded = {name: sorted(files) for name, files in touched.items() if name in trl_names - guarded}
    assert not unguarded, f"TRL attributes read or written but not guarded: {unguarded}"


def test_trls_init_still_sets_every_guarded_attribute():
    import inspect

    assert trl_api.trl_attribute_problems(inspect.getsource(GRPOTrainer.__init__)) == []


@pytest.mark.parametrize("name", _trl_protocol_members())
def test_a_protocol_attribute_that_trl_no_longer_sets_is_named(name):
    """The guard reads TRL's ``__init__``: one that no longer sets a protocol's TRL attribute fails by that name."""
    import inspect

    source = re.sub(rf"\bself\.{re.escape(name)}\b", f"self.{name}_renamed", inspect.getsource(GRPOTrainer.__init__))
    assert f"GRPOTrainer.__init__ no longer sets self.{name}" in trl_api.trl_attribute_problems(source)


def test_a_built_trainer_without_a_protocol_attribute_is_named(tiny_model_path, tmp_path):
    """On a built trainer (HF generate: the generate backend's protocol), removing any protocol attribute that comes
    from TRL makes the seam check name it."""
    from conftest import cpu_args, digit_fraction, make_prompts

    import trl_reasoning as tr
    from trl_reasoning.async_rollouts import protocols
    from trl_reasoning.trainer.rollout import RolloutHost

    trainer = tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path))),
        train_dataset=make_prompts(),
    )
    checked = (RolloutHost, protocols.AsyncRolloutHost, protocols.GenerateBackendHost)
    assert all(isinstance(trainer, protocol) for protocol in checked)
    trl_api.check_rollout_host(trainer, *checked)
    names = [name for name in _trl_protocol_members() if name not in trl_api.TRL_VLLM_INSTANCE_ATTRIBUTES]
    assert "eos_token_ids" in names and "generation_config" in names
    for name in names:
        value = vars(trainer).pop(name)
        try:
            with pytest.raises(trl_api.TRLCompatibilityError, match=rf"\.{name}\b"):
                trl_api.check_rollout_host(trainer, *checked)
        finally:
            setattr(trainer, name, value)


def test_a_trl_that_no_longer_builds_the_tool_tables_is_named(monkeypatch):
    """The tool-call guard wraps the per-rollout tool tables TRL's scoring builds: a TRL that builds them elsewhere, or
    under another name, must fail loudly when a trainer is built, not leave the tools unguarded in silence."""
    original = GRPOTrainer._generate_and_score_completions

    def without_tables(self, inputs):  # a TRL release that moved the tables
        return original(self, inputs)

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", without_tables)
    with pytest.raises(trl_api.TRLCompatibilityError, match=r"no longer sets self\._sync_tool_dicts"):
        trl_api.check_trl_private_api(GRPOTrainer)
