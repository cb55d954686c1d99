"""The trainer's composed parts on the loss path: the importance-sampling correction (``trainer/correction.py``) and
DPPO's top-K forward (``trainer/topk_forward.py``) read the trainer only through their ``Protocol`` hosts, which the
TRL-API guard checks as it checks ``RolloutHost``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from _trl_sources import assigned as _assigned
from _trl_sources import trl_names as _trl_names

from trl_reasoning.async_rollouts.protocols import protocol_members
from trl_reasoning.trainer import base as seam
from trl_reasoning.trainer import correction, topk_forward, trl_api
from trl_reasoning.trainer.correction import CorrectionHost, ImportanceCorrection
from trl_reasoning.trainer.topk_forward import TopKEngineHost, TopKForward, TopKForwardHost

#: Each part, its module, and the protocols it reads its trainer through.
PARTS = {
    ImportanceCorrection: (correction, (CorrectionHost,)),
    TopKForward: (topk_forward, (TopKForwardHost, TopKEngineHost)),
}
#: Each protocol and the guard list its members from TRL must be in.
GUARDED = {
    CorrectionHost: trl_api.TRL_INSTANCE_ATTRIBUTES,
    TopKForwardHost: trl_api.TRL_INSTANCE_ATTRIBUTES,
    TopKEngineHost: trl_api.TRL_VLLM_INSTANCE_ATTRIBUTES,
}


@pytest.mark.parametrize("part", list(PARTS), ids=lambda part: part.__name__)
def test_the_protocols_name_exactly_what_the_part_reads(part):
    """Every ``host.X`` (and ``getattr(host, "X", ...)``) of the part's module is a member of its protocols, and every
    member is read somewhere: the protocols are the whole of what the part takes from the trainer."""
    module, protocols = PARTS[part]
    text = Path(module.__file__).read_text()
    read = set(re.findall(r"\bhost\.(\w+)", text)) | set(re.findall(r"getattr\((?:self\.)?host, \"(\w+)\"", text))
    named = {name for protocol in protocols for name in protocol_members(protocol)}
    assert read - named == set(), f"{part.__name__} reads these but its protocols do not name them"
    assert named - read == set(), f"{part.__name__}'s protocols name these but it never reads them"


@pytest.mark.parametrize("part", list(PARTS), ids=lambda part: part.__name__)
def test_the_part_reaches_the_trainer_only_through_its_host(part):
    """The part's ``self.X`` are its own (its methods, properties and the state it sets), never the trainer's, and
    its module imports no trainer: whatever it needs of the trainer goes through ``self.host``."""
    module, _ = PARTS[part]
    source = inspect.getsource(part)
    own = set(vars(part)) | _assigned(source)
    used = set(re.findall(r"\bself\.(\w+)", source))
    assert "host" in own and used - own == set(), f"{part.__name__} reads the trainer beside its host"
    imports = re.findall(r"^\s*(?:from|import) (\S+)", Path(module.__file__).read_text(), flags=re.MULTILINE)
    assert not [name for name in imports if "base" in name or name.startswith("trl_reasoning.trainer")], imports
    assert "ReasoningTrainer" not in re.sub(r'""".*?"""|#[^\n]*', "", Path(module.__file__).read_text(), flags=re.S)


@pytest.mark.parametrize("protocol", list(GUARDED), ids=lambda protocol: protocol.__name__)
def test_every_member_from_trl_is_guarded(protocol):
    """A member of the parts' protocols that comes from TRL's GRPOTrainer is in the guard list of its backend (the
    others are transformers' Trainer's or trl-reasoning's trainer's own)."""
    import transformers

    trainer_names = _assigned(inspect.getsource(transformers.Trainer)) | set(dir(transformers.Trainer))
    own_classes = [k for k in seam.ReasoningTrainer.__mro__ if k.__module__.startswith("trl_reasoning")]
    own = {name for k in own_classes for name in vars(k)} | {
        name for k in own_classes for name in _assigned(inspect.getsource(k))
    }
    from_trl = [name for name in protocol_members(protocol) if name in _trl_names()]
    for name in protocol_members(protocol):
        if name in from_trl:
            assert name in GUARDED[protocol], f"{protocol.__name__}.{name} comes from TRL and is not guarded"
        else:
            assert name in trainer_names or name in own, f"{protocol.__name__}.{name}: nobody sets it"
    assert from_trl, f"{protocol.__name__} names TRL's state: the check above is not vacuous"


class _Lacking:
    """The trainer seen without one attribute (``hasattr`` is False for it, the rest reads through)."""

    def __init__(self, trainer, lacking: str) -> None:
        self.__dict__.update(lacking_trainer=trainer, lacking_name=lacking)

    def __getattr__(self, name):
        if name == self.__dict__["lacking_name"]:
            raise AttributeError(name)
        return getattr(self.__dict__["lacking_trainer"], name)


@pytest.fixture(scope="module")
def built_trainer(tiny_model_path, tmp_path_factory):
    from conftest import cpu_args, digit_fraction, make_prompts

    import trl_reasoning as tr

    return tr.ReasoningTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path_factory.mktemp("parts")))),
        train_dataset=make_prompts(),
    )


def test_a_built_trainer_lacking_a_part_s_member_is_named(built_trainer):
    """The trainer has every member of the parts' protocols (HF generate: not the vLLM engine's), holds the parts,
    and the guard names any member it lacks."""
    trainer = built_trainer
    assert isinstance(trainer, CorrectionHost) and isinstance(trainer, TopKForwardHost)
    assert not isinstance(trainer, TopKEngineHost)  # vLLM's engine: checked only when vLLM generates
    assert isinstance(trainer.correction, ImportanceCorrection) and trainer.correction.host is trainer
    assert isinstance(trainer.topk_forward, TopKForward) and trainer.topk_forward.host is trainer
    assert TopKForward not in type(trainer).__mro__  # composed, no longer mixed in
    trl_api.check_rollout_host(trainer, CorrectionHost, TopKForwardHost)
    with pytest.raises(trl_api.TRLCompatibilityError, match=r"TopKEngineHost\.vllm_generation\b"):
        trl_api.check_rollout_host(trainer, TopKEngineHost)
    for protocol in (CorrectionHost, TopKForwardHost):
        for name in protocol_members(protocol):
            with pytest.raises(trl_api.TRLCompatibilityError, match=rf"{protocol.__name__}\.{name}\b"):
                trl_api.check_rollout_host(_Lacking(trainer, name), protocol)


def test_the_trainer_s_engine_topk_is_the_top_k_part_s(built_trainer):
    """``_engine_topk``, a member of ``AsyncRolloutHost`` (the asynchronous rollouts append the vLLM server's top-K to
    it), reads and writes the top-K part's own state, so the rollouts and the part see one value."""
    trainer = built_trainer
    assert trainer._engine_topk is trainer.topk_forward.engine_topk is None


@pytest.mark.parametrize(
    ("lacking", "named"),
    [
        ("temperature", "TopKForwardHost.temperature"),
        ("vllm_importance_sampling_clip_min", "CorrectionHost.vllm_importance_sampling_clip_min"),
    ],
)
def test_building_a_trainer_whose_trl_lacks_a_part_s_member_names_it(lacking, named, tiny_model_path, tmp_path):
    """The check runs when a trainer is built: a TRL that no longer sets a member of a part's protocol fails there,
    by the protocol's name, before the part is made."""
    from conftest import cpu_args, digit_fraction, make_prompts

    import trl_reasoning as tr

    class WithoutIt(tr.ReasoningTrainer):
        def _init_seam_state(self):
            delattr(self, lacking)
            super()._init_seam_state()

    with pytest.raises(trl_api.TRLCompatibilityError, match=rf"{re.escape(named)}\b.*which trl-reasoning"):
        WithoutIt(
            model=tiny_model_path,
            reward_funcs=digit_fraction,
            args=tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path))),
            train_dataset=make_prompts(),
        )
