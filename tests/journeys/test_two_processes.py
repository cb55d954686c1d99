"""Journey: two real gloo processes (torchrun) train DAPO with dynamic sampling (synchronous and asynchronous) and
ScaleRL with no-positive-resampling (asynchronous by default),
with checkpoints every 2 steps to step 5; then a second torchrun, a restarted job, resumes both from checkpoint-4 and
finishes. Both ranks must end every run at max_steps with the same parameters and decisions, and the resumed run must
train step 5 as the uninterrupted one did and keep ScaleRL's retired prompts retired (it once did not: accelerate wraps
the sampler of a resumed multi-process dataloader one level deeper than the Trainer's set_epoch reaches, so the
sampler replayed epoch 0; the checkpoint now carries the sampler's epoch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import run_torchrun

WORKER = Path(__file__).with_name("two_process_worker.py")
PRESETS = ("DAPO", "ScaleRL", "DAPO-async", "DAPO-async-process")
MAX_STEPS = 5


def _torchrun(model_path: str, out_dir: Path, mode: str) -> None:
    run_torchrun(WORKER, model_path, str(out_dir), mode, timeout=300)


def _reports(out_dir: Path, preset: str, mode: str) -> list[dict]:
    reports = []
    for rank in (0, 1):
        path = out_dir / preset / f"{mode}-rank{rank}.json"
        assert path.is_file(), f"rank {rank} did not finish the {mode} run of {preset}"
        reports.append(json.loads(path.read_text()))
    return reports


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("two-processes")
    _torchrun(tiny_model_path, out_dir, "train")
    _torchrun(tiny_model_path, out_dir, "resume")
    return out_dir


def _first_call_of_last_step(report: dict, resumed: bool) -> int:
    """Index, in the run's reward calls, of the first generation round of step MAX_STEPS."""
    if resumed:
        return 0  # the resumed run generates for step 5 only
    rounds = report["generation_rounds"]
    return int(sum(rounds[: MAX_STEPS - 1])) if rounds else MAX_STEPS - 1


def _last_step_prompts(reports: list[dict], resumed: bool) -> list[list[str]]:
    return [r["reward_calls"][_first_call_of_last_step(r, resumed)] for r in reports]


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_two_processes_train_past_checkpoints_and_resume(preset, runs):
    train, resume = _reports(runs, preset, "train"), _reports(runs, preset, "resume")
    for reports in (train, resume):
        assert [r["world_size"] for r in reports] == [2, 2]
        assert [r["global_step"] for r in reports] == [MAX_STEPS, MAX_STEPS]
        # The ranks agree: same parameters (DDP), same decisions, same logs.
        assert reports[0]["parameter_checksum"] == reports[1]["parameter_checksum"]
        assert reports[0]["losses"] == reports[1]["losses"]
        assert reports[0]["sampling_state"] == reports[1]["sampling_state"]
        assert reports[0]["generation_rounds"] == reports[1]["generation_rounds"]
        assert reports[0]["retired_prompts"] == reports[1]["retired_prompts"]
        assert sorted(int(step) for step in reports[0]["losses"]) == list(range(1, MAX_STEPS + 1))
        assert all(math.isfinite(loss) for loss in reports[0]["losses"].values())
    assert {"checkpoint-2", "checkpoint-4"} <= {p.name for p in (runs / preset).iterdir()}
    # Asynchronous presets (ScaleRL by default, k = 8; DAPO-async, k = 2): batch g is sampled by the weights of step
    # g - k on both ranks, and the resumed job continues the pipeline from the checkpoint's behaviour weights.
    k = {"DAPO": None, "ScaleRL": 8, "DAPO-async": 2, "DAPO-async-process": 2}[preset]
    for reports in (train, resume):
        want = {} if k is None else {str(s): float(min(s - 1, k)) for s in range(1, MAX_STEPS + 1)}
        assert reports[0]["staleness"] == reports[1]["staleness"] == want
    # The resumed job generated only for the step it had left (steps 1-4 of its logs come from the checkpoint).
    calls = int(resume[0]["generation_rounds"][-1]) if preset.startswith("DAPO") else 1
    assert [len(r["reward_calls"]) for r in resume] == [calls, calls]
    assert resume[0]["losses"]["4"] == train[0]["losses"]["4"]

    # The feature was exercised before the checkpoint the resumed job starts from.
    state = json.loads((runs / preset / "checkpoint-4" / "trl_reasoning_sampling_state.json").read_text())
    if preset.startswith("DAPO"):
        assert any(rounds > 1 for rounds in train[0]["generation_rounds"]), train[0]["generation_rounds"]
        assert state["prompt_stream"] is not None
    else:
        # Every "fixed" prompt scores 1 on every completion: all 3 are retired in epoch 0 (steps 1-3), so the
        # uninterrupted run's epoch 1 (steps 4-5) trains on "open" prompts only. (An "open" group of 4 can pass by
        # chance, 1/81 a group: with the sampling seeds of this asynchronous run one does, and is retired too.)
        assert train[0]["retired_prompts"][2] >= 3, train[0]["retired_prompts"]
        assert len(state["retired_prompts"]["epoch_of"]) == train[0]["retired_prompts"][2]
        epoch_one = [call for r in train for call in r["reward_calls"][3:]]
        assert len(epoch_one) == 4 and not any(text.startswith("fixed") for call in epoch_one for text in call)
        assert resume[0]["sampling_state"]["retired_prompts"] == state["retired_prompts"]  # restored, then kept


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_two_process_resume_trains_the_step_it_left(preset, runs):
    train, resume = _reports(runs, preset, "train"), _reports(runs, preset, "resume")
    assert _last_step_prompts(resume, resumed=True) == _last_step_prompts(train, resumed=False)
    assert resume[0]["losses"][str(MAX_STEPS)] == pytest.approx(train[0]["losses"][str(MAX_STEPS)], rel=1e-4, abs=1e-6)
    assert resume[0]["sampling_state"] == train[0]["sampling_state"]
    assert resume[0]["parameter_checksum"] == pytest.approx(train[0]["parameter_checksum"], rel=1e-6, abs=1e-6)


@pytest.mark.journey
@pytest.mark.slow
def test_scalerl_retired_prompts_stay_retired_after_two_process_resume(runs):
    # The "fixed" prompts were all retired in epoch 0 (checked above): the resumed step 5 must not train on one.
    resumed = [call for r in _reports(runs, "ScaleRL", "resume") for call in r["reward_calls"]]
    assert not any(text.startswith("fixed") for call in resumed for text in call), resumed


@pytest.mark.journey
@pytest.mark.slow
def test_two_process_generator_processes_train_as_the_inline_generator(runs):
    """Each rank's generator process samples the batches its in-process generator would (same seeds, same weights):
    the same decisions and losses, parameters to float tolerance (the sampler's log-probs come from another forward)."""
    for mode in ("train", "resume"):
        inline, process = _reports(runs, "DAPO-async", mode), _reports(runs, "DAPO-async-process", mode)
        assert [r["generation_rounds"] for r in process] == [r["generation_rounds"] for r in inline]
        assert [r["reward_calls"] for r in process] == [r["reward_calls"] for r in inline]
        for step, loss in inline[0]["losses"].items():
            assert process[0]["losses"][step] == pytest.approx(loss, rel=1e-3, abs=1e-4)
        assert process[0]["parameter_checksum"] == pytest.approx(inline[0]["parameter_checksum"], rel=1e-5)
