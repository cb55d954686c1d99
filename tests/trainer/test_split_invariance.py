"""The gradient of one optimizer step must not depend on how the global batch is split.

Same global batch of 8 completions (2 prompts x 4) in three layouts: one process with GA=1, one process with GA=2,
and two processes (gloo, launched with torchrun: `accelerate launch --cpu --num_processes 2` silently runs one), all
with padding-free forwards (the default; GA=2 rebalances the micro-batches by tokens), and each must give the gradient
of one process with TRL's padded forwards (`padding_free=False`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_torchrun
from split_worker import COMBINATIONS, GLOBAL_BATCH, gradients


def _assert_close(a: torch.Tensor, b: torch.Tensor, what: str):
    assert a.abs().sum() > 0, f"{what}: zero gradient, the comparison would be vacuous"
    error = (a - b).norm() / a.norm()
    assert error < 1e-5, f"{what}: relative gradient difference {error:.2e}"


@pytest.fixture(scope="module")
def single_process_gradients(tiny_model_path, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("split"))
    return {
        "GA=1": gradients(tiny_model_path, per_device=GLOBAL_BATCH, grad_accum=1, output_dir=out),
        "GA=2": gradients(tiny_model_path, per_device=GLOBAL_BATCH // 2, grad_accum=2, output_dir=out),
        "GA=4": gradients(tiny_model_path, per_device=GLOBAL_BATCH // 4, grad_accum=4, output_dir=out),
        "padded": gradients(
            tiny_model_path, per_device=GLOBAL_BATCH, grad_accum=1, output_dir=out, padding_free=False
        ),
    }


def test_gradient_accumulation_does_not_change_the_gradient(single_process_gradients):
    for key in single_process_gradients["GA=1"]:
        _assert_close(single_process_gradients["GA=1"][key], single_process_gradients["GA=2"][key], f"{key} GA=2")
        _assert_close(single_process_gradients["GA=1"][key], single_process_gradients["GA=4"][key], f"{key} GA=4")


def test_padding_free_gives_the_padded_gradient(single_process_gradients):
    """Packed forwards, whole (GA=1) or in token-balanced micro-batches (GA=2, GA=4), train as TRL's padded ones."""
    for key, padded in single_process_gradients["padded"].items():
        for layout in ("GA=1", "GA=2", "GA=4"):
            _assert_close(padded, single_process_gradients[layout][key], f"{key} packed {layout}")


@pytest.mark.slow
def test_two_processes_give_the_single_process_gradient(single_process_gradients, tiny_model_path, tmp_path):
    out_file = tmp_path / "two_processes.pt"
    worker = Path(__file__).with_name("split_worker.py")
    run_torchrun(worker, tiny_model_path, str(out_file), str(GLOBAL_BATCH // 2), "1")
    two_processes = torch.load(out_file)
    assert len(two_processes) == len(COMBINATIONS)
    for key, expected in single_process_gradients["GA=1"].items():
        _assert_close(expected, two_processes[key], f"{key} two processes")
        _assert_close(single_process_gradients["padded"][key], two_processes[key], f"{key} two processes, packed")
