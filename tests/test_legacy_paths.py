"""Module paths from before the layered layout (0.1) keep importing, and configs pickled under them keep loading."""

import importlib
import pickle

import pytest

from trl_reasoning import DAPOConfig, ScaleRLConfig
from trl_reasoning._legacy_paths import MOVED_MODULES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_imports_the_module_at_its_new_path(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED_MODULES[old])


@pytest.mark.parametrize(
    ("config_class", "old_module"), [(DAPOConfig, "trl_reasoning.dapo"), (ScaleRLConfig, "trl_reasoning.scalerl")]
)
def test_a_config_pickled_by_0_1_loads_as_the_same_class(tmp_path, config_class, old_module):
    config = config_class(output_dir=str(tmp_path), max_steps=3, epsilon_high=0.3, use_cpu=True, bf16=False)
    # Protocol 2 names a class as "module\nname\n": written as 0.1 wrote it, with the module's old path.
    data = pickle.dumps(config, protocol=2)
    new_module = config_class.__module__.encode()
    assert b"c" + new_module + b"\n" in data
    old = data.replace(b"c" + new_module + b"\n", b"c" + old_module.encode() + b"\n")
    assert old != data
    loaded = pickle.loads(old)
    assert type(loaded) is config_class
    assert (loaded.max_steps, loaded.epsilon_high) == (3, 0.3)


def test_names_that_became_packages_still_export_their_old_public_names():
    from trl_reasoning.async_rollouts import AsyncRollouts, job_seed  # noqa: F401
    from trl_reasoning.evaluation import mean_pass_at_k, pass_at_k  # noqa: F401
    from trl_reasoning.rewards import RewardFunctionError, overlong_penalty, wrap_reward_function  # noqa: F401
    from trl_reasoning.trainer import TRL_PRIVATE_API, ReasoningTrainer, check_trl_private_api  # noqa: F401
