"""trl-reasoning overrides TRL private methods: a TRL upgrade that moves them must fail loudly, by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOTrainer

from trl_reasoning import trainer as seam


def test_installed_trl_has_every_private_method_we_rely_on():
    seam.check_trl_private_api(GRPOTrainer)


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
        "_get_per_token_logps_and_entropies",
    }
    assert overridden <= set(seam.TRL_PRIVATE_API)


@pytest.mark.parametrize("name", list(seam.TRL_PRIVATE_API))
def test_a_removed_method_is_named(name):
    Missing = type("Missing", (), {k: getattr(GRPOTrainer, k) for k in seam.TRL_PRIVATE_API if k != name})
    with pytest.raises(seam.TRLCompatibilityError, match=rf"Missing\.{name} no longer exists"):
        seam.check_trl_private_api(Missing)


def test_a_changed_signature_is_named():
    class Changed(GRPOTrainer):
        def _compute_loss(self, model, batch, extra=None):  # `inputs` renamed
            return None

    with pytest.raises(seam.TRLCompatibilityError, match=r"Changed\._compute_loss takes \(model, batch, extra\)"):
        seam.check_trl_private_api(Changed)


def test_supported_range_matches_pyproject_and_installed_trl():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if re.match(r"trl\b", d))
    spec = SpecifierSet(pin[len("trl") :])
    low, high = seam.SUPPORTED_TRL
    assert spec == SpecifierSet(f">={low},<{high}")
    assert Version(trl.__version__) in spec
    assert Version(seam.TRL_CHECKED_VERSION) in spec


def test_unsupported_trl_version_warns(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "2.0.0")
    with pytest.warns(UserWarning, match=r"trl-reasoning supports trl>=1\.16\.0,<1\.17\.0, but trl 2\.0\.0"):
        seam.warn_if_trl_unsupported()


def test_a_changed_trl_helper_function_is_named(monkeypatch):
    import trl.trainer.utils as trl_utils

    def add_fused_lm_head(model, temperature=1.0, outputs=("log_probs",)):  # cast_lm_head_to_fp32 dropped
        return None

    monkeypatch.setattr(trl_utils, "add_fused_lm_head", add_fused_lm_head)
    with pytest.raises(seam.TRLCompatibilityError, match=r"trl\.trainer\.utils\.add_fused_lm_head takes"):
        seam.check_trl_private_api(GRPOTrainer)


def test_the_fused_head_outputs_are_trls():
    """The PEFT FP32-head path rebuilds TRL's fused LM head with TRL's own arguments: read them from TRL's source."""
    import inspect

    source = inspect.getsource(GRPOTrainer.__init__)
    assert f"outputs={seam.TRL_FUSED_LM_HEAD_OUTPUTS!r}" in source.replace('"', "'"), (
        "GRPOTrainer.__init__ no longer asks its fused LM head for "
        f"{seam.TRL_FUSED_LM_HEAD_OUTPUTS}: update TRL_FUSED_LM_HEAD_OUTPUTS"
    )
