"""`import trl_reasoning` is as quiet and as light as `import trl`: it prints nothing and imports none of the libraries
the trainers need (a name is imported on first use). It printed bitsandbytes' "Failed to load CPU gemm_4bit_forward
from kernels-community" warning: transformers imports peft, and peft bitsandbytes, when they are installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
