"""Journey: a user brings the reward function that works with `trl.GRPOTrainer` to trl-reasoning.

Every return type TRL 1.16 trains with (its conversion: `None` -> NaN, then `torch.tensor(output, dtype=float32)`)
must train with the presets too, past a checkpoint. A reward function is called as often as TRL calls it (once per
generation batch), a transient failure retried sample by sample keeps its values under `on_reward_error="exclude"`,
and under `"raise"` the retries stop at the first failing sample and the error names the function.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import Recorder, logged_metric, make_prompts, message_text
from trl import GRPOConfig, GRPOTrainer

import trl_reasoning as tr
from journeys._helpers import assert_finite_losses, journey_args, step_losses

STEPS = 3  # a checkpoint at 2, one step after it


def _texts(completions) -> list[str]:
    return [message_text(c) for c in completions]


def _digits(completions) -> list[int]:
    return [sum(ch.isdigit() for ch in t) for t in _texts(completions)]


def _score(completions) -> list[float]:
    """A dense score that varies within a group (character codes), so groups are informative."""
    return [(sum(map(ord, t)) % 7) / 6.0 for t in _texts(completions)]


#: name -> how the reward builds its return value from the completions. Every one is accepted by TRL 1.16.
RETURN_TYPES = {
    "python_ints": lambda c: [int(s * 6) for s in _score(c)],
    "python_floats": lambda c: _score(c),
    "python_bools": lambda c: [s > 0.5 for s in _score(c)],
    "floats_with_none": lambda c: [None if i % 3 == 0 else s for i, s in enumerate(_score(c))],
    "numpy_float32": lambda c: np.asarray(_score(c), dtype=np.float32),
    "numpy_float64": lambda c: np.asarray(_score(c), dtype=np.float64),
    "numpy_int64": lambda c: np.asarray([int(s * 6) for s in _score(c)], dtype=np.int64),
    "numpy_bool": lambda c: np.asarray([s > 0.5 for s in _score(c)], dtype=bool),
    "numpy_scalars": lambda c: [np.float32(s) if i % 2 else np.float64(s) for i, s in enumerate(_score(c))],
    "numpy_int_scalars": lambda c: [np.int64(d) for d in _digits(c)],
    "numpy_bool_scalars": lambda c: [np.bool_(s > 0.5) for s in _score(c)],
    "torch_tensor": lambda c: torch.tensor(_score(c)),
    "torch_score_head_n_by_1": lambda c: torch.tensor(_score(c))[:, None],  # a reward model's (n, 1) logits
    "tuple": lambda c: tuple(_score(c)),
    "generator": lambda c: (s for s in _score(c)),
}


def _reward_returning(kind: str):
    build = RETURN_TYPES[kind]

    def reward(completions, **kwargs):
        return build(completions)

    reward.__name__ = f"reward_{kind}"
    return reward


def _build(trainer_cls, config_cls, reward, model_path, output_dir, **overrides):
    args = config_cls(**journey_args(output_dir, max_steps=STEPS, max_completion_length=8), **overrides)
    return trainer_cls(model=model_path, reward_funcs=reward, args=args, train_dataset=make_prompts(8))


def _run(trainer_cls, config_cls, reward, model_path, output_dir, **overrides):
    trainer = _build(trainer_cls, config_cls, reward, model_path, output_dir, **overrides)
    trainer.train()
    return trainer


def _assert_trained(trainer, reward_name: str) -> None:
    assert trainer.state.global_step == STEPS
    assert_finite_losses(step_losses(trainer), range(1, STEPS + 1))
    means = logged_metric(trainer, f"rewards/{reward_name}/mean")
    assert len(means) == STEPS and all(math.isfinite(m) for m in means), means


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize("kind", list(RETURN_TYPES))
def test_reward_return_types_trl_accepts_train_with_the_presets(kind, tiny_model_path, tmp_path):
    reward = _reward_returning(kind)
    # TRL itself trains with it (the reference for "accepted") ...
    _assert_trained(_run(GRPOTrainer, GRPOConfig, reward, tiny_model_path, tmp_path / "trl"), reward.__name__)
    # ... and so do DAPO (dynamic sampling, overlong shaping) and RLOO (KL in the reward, another estimator).
    _assert_trained(_run(tr.DAPOTrainer, tr.DAPOConfig, reward, tiny_model_path, tmp_path / "dapo"), reward.__name__)
    _assert_trained(_run(tr.RLOOTrainer, tr.RLOOConfig, reward, tiny_model_path, tmp_path / "rloo"), reward.__name__)


class CountingReward:
    """A reward function (a callable object, as TRL allows) that counts its calls."""

    __name__ = "counting_reward"

    def __init__(self):
        self.calls = 0

    def __call__(self, completions, **kwargs):
        self.calls += 1
        return _score(completions)


@pytest.mark.journey
@pytest.mark.slow
@pytest.mark.parametrize(
    "trainer_cls, config_cls",
    [(tr.DAPOTrainer, tr.DAPOConfig), (tr.CISPOTrainer, tr.CISPOConfig), (tr.ScaleRLTrainer, tr.ScaleRLConfig)],
    ids=["DAPO", "CISPO", "ScaleRL"],
)
def test_reward_called_once_per_generation_batch_like_trl(trainer_cls, config_cls, tiny_model_path, tmp_path):
    reference = CountingReward()
    _run(GRPOTrainer, GRPOConfig, reference, tiny_model_path, tmp_path / "trl")
    assert reference.calls == STEPS  # TRL: one generation batch per step here, one call per batch
    counting = CountingReward()
    trainer = _run(trainer_cls, config_cls, counting, tiny_model_path, tmp_path / "preset", dynamic_sampling=False)
    assert trainer.state.global_step == STEPS
    assert counting.calls == reference.calls


class TransientReward:
    """Fails on a batch the first time it sees one of its prompts (a flaky judge or sandbox); works when called
    again."""

    __name__ = "transient_reward"

    def __init__(self):
        self.seen: set[str] = set()
        self.batch_failures = 0
        self.retried_values: list[list[float]] = []  # per failed batch, what the sample-by-sample calls returned

    def __call__(self, prompts, completions, **kwargs):
        keys = [message_text(p) for p in prompts]
        if not set(keys) <= self.seen:
            self.seen.update(keys)
            self.batch_failures += 1
            self.retried_values.append([])
            raise ConnectionError("judge timed out")
        values = _score(completions)
        if len(completions) == 1:
            self.retried_values[-1].extend(values)
        return values


@pytest.mark.journey
@pytest.mark.slow
def test_transient_reward_failure_is_retried_and_keeps_the_values(tiny_model_path, tmp_path):
    reward = TransientReward()
    trainer = _build(
        tr.DAPOTrainer,
        tr.DAPOConfig,
        reward,
        tiny_model_path,
        tmp_path,
        on_reward_error="exclude",
        dynamic_sampling=False,
    )
    recorder = Recorder(trainer)
    trainer.train()
    assert trainer.state.global_step == STEPS
    assert reward.batch_failures == STEPS  # every step brings new prompts: each batch call failed once
    errors = logged_metric(trainer, "rewards/transient_reward/errors")
    retried = logged_metric(trainer, "rewards/transient_reward/retried_ok")
    assert len(errors) == len(retried) == STEPS
    assert sum(errors) == 0, errors
    assert all(value > 0 for value in retried), retried
    # The retried samples kept the values the function returned: nothing was excluded, and the logged reward of each
    # step is the mean of what the retries returned.
    rewards = torch.cat([batch["rewards"] for batch in recorder.batches])
    assert rewards.numel() == STEPS * 8 and not torch.isnan(rewards).any()
    assert [len(values) for values in reward.retried_values] == [8] * STEPS
    expected_means = [sum(values) / len(values) for values in reward.retried_values]
    assert logged_metric(trainer, "rewards/transient_reward/mean") == pytest.approx(expected_means, rel=1e-5)
    assert_finite_losses(step_losses(trainer), range(1, STEPS + 1))


@pytest.mark.journey
@pytest.mark.slow
def test_reward_error_raise_stops_retrying_at_the_failing_sample(tiny_model_path, tmp_path):
    calls: list[list[str]] = []
    bad: dict[str, str] = {}

    def judge(completions, **kwargs):
        texts = _texts(completions)
        calls.append(texts)
        if not bad:
            bad["text"] = texts[1]  # the batch's sample 1
        if bad["text"] in texts:
            raise ValueError("unparseable answer")
        return _score(completions)

    trainer = _build(tr.DAPOTrainer, tr.DAPOConfig, judge, tiny_model_path, tmp_path, on_reward_error="raise")
    with pytest.raises(tr.RewardFunctionError, match=r"Reward function 'judge' raised ValueError on sample 1 "):
        trainer.train()
    assert calls[0][0] != calls[0][1], "samples 0 and 1 have the same completion: the test cannot tell them apart"
    assert [len(call) for call in calls] == [8, 1, 1]  # the batch, then samples 0 and 1, then it stops
    assert calls[1] == [calls[0][0]] and calls[2] == [calls[0][1]]
    assert trainer.state.global_step == 0
