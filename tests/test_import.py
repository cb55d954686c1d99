"""`import trl_reasoning` is as quiet and as light as `import trl`: it prints nothing and imports none of the libraries
the trainers need (a name is imported on first use). It printed bitsandbytes' "Failed to load CPU gemm_4bit_forward
from kernels-community" warning: transformers imports peft, and peft bitsandbytes, when they are installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Imported by the trainers (directly, or by transformers when installed); none of them on `import trl_reasoning`.
HEAVY = ["torch", "transformers", "trl", "peft", "bitsandbytes", "deepspeed", "matplotlib", "datasets", "accelerate"]


def test_import_prints_nothing_and_imports_no_heavy_library():
    loaded = f"sorted(set(sys.modules) & set({HEAVY!r}))"
    code = f"import sys, trl_reasoning; import json; sys.stdout.write('loaded: ' + json.dumps({loaded}) + '\\n')"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = (result.stdout + result.stderr).splitlines()
    assert len(output) == 1 and output[0].startswith("loaded: "), output  # no line but the report
    assert json.loads(output[0].removeprefix("loaded: ")) == []


def test_the_subpackages_export_their_public_names():
    from trl_reasoning.async_rollouts import AsyncRollouts, job_seed  # noqa: F401
    from trl_reasoning.evaluation import mean_pass_at_k, pass_at_k  # noqa: F401
    from trl_reasoning.rewards import RewardFunctionError, overlong_penalty, wrap_reward_function  # noqa: F401
    from trl_reasoning.trainer import TRL_PRIVATE_API, ReasoningTrainer, check_trl_private_api  # noqa: F401


@pytest.mark.parametrize("module", ["trl_reasoning.algorithms", "trl_reasoning.utils.user_warnings"])
def test_the_pure_math_floor_imports_no_trl(module):
    """``utils.user_warnings`` finds TRL's folder with ``importlib.util.find_spec`` (which does not run the package),
    so the floors below the trainer stay TRL-free also through it."""
    code = f"import sys, {module}; sys.stdout.write(repr(sorted({{'trl', 'transformers'}} & set(sys.modules))))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]"
