"""Journey: past one process for real. Two gloo processes train DAPO (dynamic sampling) and DPPO (top-K TV) for three
steps, saving a checkpoint at step 2 that a fresh trainer resumes from, under DDP, DeepSpeed ZeRO-2, DeepSpeed ZeRO-3 (every parameter partitioned) and FSDP2 (forced onto the CPU, see
``sharded_worker.force_fsdp_on_cpu``), from the same seed, with padding-free forwards (the default). Every sharded run
must take the same decisions and losses as DDP and end with the same parameters (float32 reduction order aside), every
packed run must match DDP with TRL's padded forwards (``padding_free=False``), and DPPO's top-K must not fall back to
the ``[B, T, vocab]`` logits when the LM head is sharded.

Run alone with ``pytest -m sharded``. Needs DeepSpeed (in the ``test`` extra); skipped without it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_torchrun

from trl_reasoning.trainer.guards import LaunchWarning, warn_if_fsdp_not_applied

WORKER = Path(__file__).with_name("sharded_worker.py")
PADDED = "ddp_padded"  # sharded_worker.PADDED: DDP with padding_free=False
STRATEGIES = ("ddp", "zero2", "zero3", "fsdp2")
PRESETS = ("DAPO", "DPPO")
#: Largest parameter difference from the DDP run after three steps (lr 1e-2): the strategies sum gradients in another
#: order (reduce-scatter vs all-reduce, bucketed), which moves float32 results by ~1e-5.
PARAMETER_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory) -> dict[str, dict[str, dict]]:
    pytest.importorskip("deepspeed")
    out_dir = tmp_path_factory.mktemp("sharded")
    # One launch runs every strategy in turn (the worker resets the process-wide state between them).
    run_torchrun(WORKER, ",".join((*STRATEGIES, PADDED)), tiny_model_path, str(out_dir))
    reports = {
        strategy: {preset: torch.load(out_dir / strategy / f"{preset}.pt", weights_only=False) for preset in PRESETS}
        for strategy in (*STRATEGIES, PADDED)
    }
    return reports


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.sharded
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("strategy", STRATEGIES[1:])
def test_sharded_training_matches_ddp(strategy, preset, runs):
    ddp, sharded = runs["ddp"][preset], runs[strategy][preset]
    expected_type = {"zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp2": "FSDP"}[strategy]
    assert ddp["distributed_type"].endswith("MULTI_CPU") and sharded["distributed_type"].endswith(expected_type)
    assert sharded["world_size"] == ddp["world_size"] == 2
    if strategy.startswith("zero"):
        assert sharded["zero_stage"] == int(strategy[-1])
    assert sharded["global_step"] == ddp["global_step"] == 3
    # Same completions and decisions: the rewards of every step agree exactly, the losses to float32 rounding.
    assert sharded["rewards"] == ddp["rewards"]
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-4, abs=1e-6)
    assert sharded["moved"] > 1e-3  # the steps did train
    difference = max((sharded["parameters"][n] - ddp["parameters"][n]).abs().max().item() for n in ddp["parameters"])
    assert difference < PARAMETER_TOLERANCE


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.sharded
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_padding_free_training_matches_the_padded_run(strategy, preset, runs):
    """Packed forwards (ZeRO-3 and FSDP2: the same number of forwards on every process, the top-K head inside the
    forward) train as TRL's padded ones: same rewards, losses and parameters as DDP with ``padding_free=False``."""
    padded, packed = runs[PADDED][preset], runs[strategy][preset]
    assert packed["padding_free"] and not padded["padding_free"]
    assert packed["rewards"] == padded["rewards"]
    assert packed["losses"] == pytest.approx(padded["losses"], rel=1e-4, abs=1e-6)
    difference = max(
        (packed["parameters"][n] - padded["parameters"][n]).abs().max().item() for n in padded["parameters"]
    )
    assert difference < PARAMETER_TOLERANCE


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.sharded
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sharded_checkpoint_resumes_to_the_uninterrupted_run(strategy, preset, runs):
    """A fresh trainer resumed from the step-2 checkpoint of a sharded run (ZeRO's or FSDP's own checkpoint format)
    trains step 3 as the uninterrupted run did: same rewards, same loss, same parameters."""
    report = runs[strategy][preset]
    assert report["resumed_global_step"] == report["global_step"] == 3
    # The history is the checkpoint's (steps 1-2) then the resumed step 3.
    assert report["resumed_rewards"] == report["rewards"]
    assert report["resumed_losses"] == pytest.approx(report["losses"], rel=1e-4, abs=1e-6)
    assert report["resume_difference"] < PARAMETER_TOLERANCE


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.sharded
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dppo_topk_keeps_the_lm_head_path_when_sharded(strategy, runs):
    """No [B, T, vocab] logits: with a sharded head (ZeRO-3, FSDP2) the chunked head runs inside the model's forward;
    otherwise it runs on the final hidden states as on one process."""
    report = runs[strategy]["DPPO"]
    assert report["lm_head_from_hidden"]
    assert report["head_inside_forward"] == (strategy in ("zero3", "fsdp2"))


def test_fsdp_requested_on_a_cpu_run_is_reported():
    with pytest.warns(LaunchWarning, match="FSDP was requested but this run is DistributedType.MULTI_CPU"):
        warn_if_fsdp_not_applied(True, "DistributedType.MULTI_CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_fsdp_not_applied(True, "DistributedType.FSDP")
        warn_if_fsdp_not_applied(False, "DistributedType.MULTI_CPU")
