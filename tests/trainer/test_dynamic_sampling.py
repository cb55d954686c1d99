"""DAPO dynamic sampling, ScaleRL zero-variance filtering and no-positive-resampling, on the tiny model.

The reward makes a known share of groups uninformative: prompts marked "fixed" always score 1.0 (every group of
theirs has zero variance), the others score a hash of the completion (their groups are mixed).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import Recorder, StopAt, cpu_args, logged_metric, message_text, run_torchrun
from datasets import Dataset
from transformers import TrainerCallback

import trl_reasoning as tr
from trl_reasoning.algorithms.group_selection import (
    GROUP_SELECTIONS,
    GroupSelection,
    extra_round_groups,
    informative_groups,
)
from trl_reasoning.trainer.checkpoints import SAMPLING_STATE_FILE

pytestmark = pytest.mark.slow


def flagged_prompts(num_fixed: int, num_open: int) -> Dataset:
    rows = [f"fixed {i}" for i in range(num_fixed)] + [f"open {i}" for i in range(num_open)]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in rows])


def flagged_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 for a "fixed" prompt; otherwise a value that differs between different completions."""
    return [
        1.0 if message_text(p).startswith("fixed") else (sum(map(ord, message_text(c))) % 11) / 10.0
        for p, c in zip(prompts, completions)
    ]


def sparse_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 for a "fixed" prompt (pass rate 1); otherwise a 0/1 reward that passes about one completion in four."""
    return [
        1.0 if message_text(p).startswith("fixed") else float(sum(map(ord, message_text(c))) % 4 == 0)
        for p, c in zip(prompts, completions)
    ]


def constant_reward(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


def _build(model_path, dataset, reward, config_class=tr.DAPOConfig, trainer_class=tr.DAPOTrainer, **overrides):
    args = config_class(**cpu_args(**overrides))
    trainer = trainer_class(model=model_path, reward_funcs=reward, args=args, train_dataset=dataset)
    return trainer, Recorder(trainer)


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tiny_model_path, tmp_path):
    # 3 of 4 prompts are "fixed": a round of 2 groups rarely has 2 informative ones, so more rounds are needed.
    trainer, recorder = _build(
        tiny_model_path, flagged_prompts(12, 4), flagged_reward, output_dir=str(tmp_path), max_steps=3
    )
    assert trainer.args.dynamic_sampling  # DAPO's default
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert len(recorder.batches) == 3
    for batch in recorder.batches:
        assert batch["active"].all()  # exactly full: every chosen group is a real one
        assert informative_groups(batch["rewards"], 4).all()  # every kept group has mixed rewards
        assert batch["rewards"].numel() == 8
        assert batch["weights"].sum() > 0
    rounds = logged_metric(trainer, "group_selection/generation_rounds")
    assert len(rounds) == 3 and max(rounds) > 1
    assert all(0 < f < 1 for f in logged_metric(trainer, "frac_reward_zero_std"))  # TRL's, over every round
    # Only informative groups train: their task reward is never all-equal, so its mean is strictly inside (0, 1).
    trained = logged_metric(trainer, "group_selection/task_reward_trained")
    assert len(trained) == 3 and all(0 < r < 1 for r in trained)
    assert logged_metric(trainer, "group_selection/round_cap_hit") == [0.0, 0.0, 0.0]
    generated, kept = (
        logged_metric(trainer, "group_selection/groups_generated"),
        logged_metric(trainer, "group_selection/groups_kept"),
    )
    assert kept == [2.0, 2.0, 2.0] and all(g >= k for g, k in zip(generated, kept))
    losses = logged_metric(trainer, "loss")
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_running_out_of_rounds_warns_and_finishes(tiny_model_path, tmp_path):
    trainer, recorder = _build(
        tiny_model_path, flagged_prompts(4, 0), constant_reward, output_dir=str(tmp_path), max_num_gen_batches=2
    )
    with pytest.warns(tr.DynamicSamplingWarning, match=r"found 0 informative groups .* max_num_gen_batches=2"):
        trainer.train()
    assert trainer.state.global_step == 3
    assert logged_metric(trainer, "group_selection/round_cap_hit") == [1.0, 1.0, 1.0]
    assert logged_metric(trainer, "group_selection/generation_rounds") == [2.0, 2.0, 2.0]
    for batch in recorder.batches:
        assert not batch["active"].any()
        assert torch.all(batch["weights"] == 0) and torch.all(batch["advantages"] == 0)
    assert all(loss == 0.0 for loss in logged_metric(trainer, "loss"))


def test_partial_batch_normalizers_count_only_kept_groups(tiny_model_path, tmp_path):
    # Only the "open" prompt can be informative: one round gives at most one informative group of the two needed.
    trainer, recorder = _build(
        tiny_model_path,
        flagged_prompts(7, 1),
        flagged_reward,
        output_dir=str(tmp_path),
        max_num_gen_batches=1,
        max_steps=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tr.DynamicSamplingWarning)
        trainer.train()
    for batch in recorder.batches:
        rows = batch["active"].repeat_interleave(4)
        assert torch.all(batch["weights"][~rows] == 0)
        if rows.any():  # token_mean: the kept rows' weights sum to 1 over their tokens, i.e. they alone normalize
            assert torch.all(batch["weights"][rows] > 0)


def test_zero_variance_filtering_drops_groups_without_generating_more(tiny_model_path, tmp_path):
    trainer, recorder = _build(
        tiny_model_path,
        flagged_prompts(8, 8),
        flagged_reward,
        output_dir=str(tmp_path),
        dynamic_sampling=False,
        zero_variance_filtering=True,
    )
    trainer.train()
    assert "group_selection/generation_rounds" not in trainer.state.log_history[0]
    for batch in recorder.batches:
        informative = informative_groups(batch["rewards"], 4)
        assert torch.equal(batch["active"], informative)
        rows = informative.repeat_interleave(4)
        assert torch.all(batch["weights"][~rows] == 0) and torch.all(batch["advantages"][~rows] == 0)


def test_no_positive_resampling_retires_passing_prompts(tiny_model_path, tmp_path):
    trainer, _ = _build(
        tiny_model_path,
        flagged_prompts(2, 6),
        sparse_reward,
        output_dir=str(tmp_path),
        dynamic_sampling=False,
        positive_resampling_threshold=0.9,
        max_steps=12,  # 3 epochs of 4 steps (2 prompts a step)
    )
    seen = []
    original = trainer.reward_funcs[0]

    def spy(prompts, completions, **kwargs):
        seen.append((trainer.state.epoch, sorted({message_text(p) for p in prompts})))
        return original(prompts=prompts, completions=completions, **kwargs)

    trainer.reward_funcs[0] = spy
    trainer.train()
    retired = logged_metric(trainer, "group_selection/retired_prompts")
    assert retired[-1] >= 2  # the two "fixed" prompts always pass
    assert trainer.sampling_state_dict()["retired_prompts"]["epoch_of"]
    first = [prompts for epoch, prompts in seen if epoch < 1]
    assert any(p.startswith("fixed") for prompts in first for p in prompts)
    later = [prompts for epoch, prompts in seen if epoch >= 1]
    assert later and all(not p.startswith("fixed") for prompts in later for p in prompts)


def test_dynamic_sampling_draws_extra_rounds_from_an_iterable_dataset(tiny_model_path, tmp_path):
    # (was refused) Extra prompts come from the stream itself; see tests/journeys/test_streaming.py for the resume.
    iterable = flagged_prompts(4, 4).to_iterable_dataset()
    trainer, _ = _build(tiny_model_path, iterable, flagged_reward, output_dir=str(tmp_path), max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.sampling_state_dict()["prompt_stream"]["streamed"]


def _run_with_checkpoints(model_path, output_dir, stop_at=None, resume=None):
    overrides = dict(output_dir=str(output_dir), max_steps=8, positive_resampling_threshold=0.9)
    trainer, _ = _build(model_path, flagged_prompts(4, 4), sparse_reward, **overrides)
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    seen = []
    original = trainer.reward_funcs[0]

    def spy(prompts, completions, **kwargs):
        seen.append((trainer.state.global_step, [message_text(p) for p in prompts]))
        return original(prompts=prompts, completions=completions, **kwargs)

    trainer.reward_funcs[0] = spy
    trainer.train(resume_from_checkpoint=resume)
    return trainer, seen


def test_resume_restores_retired_prompts_and_the_prompt_streams(tiny_model_path, tmp_path):
    # 8 prompts, 2 per batch: 4 steps an epoch; the checkpoint at step 5 is inside epoch 2, after retirements, and
    # dynamic sampling has drawn extra prompts from its stream.
    full, full_seen = _run_with_checkpoints(tiny_model_path, tmp_path / "full")
    first, _ = _run_with_checkpoints(tiny_model_path, tmp_path / "split", stop_at=5)
    checkpoint = tmp_path / "split" / "checkpoint-5"
    state = json.loads((checkpoint / SAMPLING_STATE_FILE).read_text())
    assert state == first.sampling_state_dict()
    assert len(state["retired_prompts"]["epoch_of"]) >= 1
    assert state["prompt_stream"] is not None

    resumed, resumed_seen = _run_with_checkpoints(tiny_model_path, tmp_path / "split", resume=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 8
    assert resumed_seen == [entry for entry in full_seen if entry[0] >= 5]
    assert resumed.sampling_state_dict() == full.sampling_state_dict()
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_scalerl_defaults_and_a_training_run(tiny_model_path, tmp_path):
    trainer, recorder = _build(
        tiny_model_path,
        flagged_prompts(8, 8),
        flagged_reward,
        config_class=tr.ScaleRLConfig,
        trainer_class=tr.ScaleRLTrainer,
        output_dir=str(tmp_path),
    )
    args = trainer.args
    assert (args.advantage_estimator, args.policy_loss, args.loss_aggregation) == ("scalerl", "cispo", "prompt_mean")
    assert args.epsilon_high == 5.0 and args.beta == 0.0
    assert args.zero_variance_filtering and args.positive_resampling_threshold == 0.9
    assert args.cast_lm_head_to_fp32 and not args.dynamic_sampling
    assert trainer.model.lm_head.weight.dtype == torch.float32
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert all(torch.isfinite(torch.tensor(logged_metric(trainer, "loss"))))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert all(batch["active"] is not None for batch in recorder.batches)


def test_scalerl_loss_equals_the_formula_on_a_fixed_batch(tiny_model_path, tmp_path):
    """ScaleRL's loss on one batch with a dropped group and two kept groups: group-centred advantages divided by the
    std of the centred advantages over the kept groups (the scalerl estimator, which differs from the raw-reward
    batch std once two groups have different means), CISPO per token, prompt_mean weights; recomputed here in
    float64 from the batch's rewards and log-probabilities."""
    trainer, _ = _build(
        tiny_model_path,
        flagged_prompts(8, 8),
        flagged_reward,
        config_class=tr.ScaleRLConfig,
        trainer_class=tr.ScaleRLTrainer,
        output_dir=str(tmp_path),
        positive_resampling_threshold=None,
        per_device_train_batch_size=12,
    )
    dataset = flagged_prompts(2, 3)
    batch = [dataset[i] for i in (0, 2, 3) for _ in range(4)]  # one fixed (zero-variance) group, two open groups
    trainer.model.train()
    torch.manual_seed(7)
    inputs = trainer._generate_and_score_completions(batch)
    rewards = trainer.last_train_batch.rewards.double()
    groups = rewards.view(3, 4)
    assert groups[0].tolist() == [1.0] * 4 and all(len(set(g.tolist())) > 1 for g in groups[1:])
    assert groups[1].mean() != groups[2].mean()  # so scalerl and the raw-reward batch std differ
    assert inputs["row_active"].tolist() == [0] * 4 + [1] * 8

    # Independent float64 formula.
    centred = groups[1:] - groups[1:].mean(dim=1, keepdim=True)
    open_advantages = (centred / (centred.flatten().std() + 1e-4)).flatten()
    advantages = torch.cat([torch.zeros(4, dtype=torch.float64), open_advantages])
    torch.testing.assert_close(inputs["advantages"].double(), advantages, rtol=1e-5, atol=1e-6)
    raw_std = (groups[1:].flatten() - groups[1:].mean(dim=1).repeat_interleave(4)) / (
        groups[1:].flatten().std() + 1e-4
    )
    assert not torch.allclose(open_advantages, raw_std)

    mask = inputs["completion_mask"].double()
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = trainer.model(input_ids=input_ids, attention_mask=attention).logits.double()
    t = inputs["completion_ids"].shape[1]
    logits = logits[:, -t - 1 : -1] / trainer.args.temperature
    logps = torch.log_softmax(logits, dim=-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    # On-policy: ratio 1 (below the cap c = 5), so the CISPO term per token is -A * log pi; prompt_mean weights
    # are 1 / (P * tokens of the prompt's group), P = number of kept prompts (2).
    per_token = -advantages.unsqueeze(1) * logps
    group_tokens = mask.view(3, 4, -1).sum(dim=(1, 2)).repeat_interleave(4)
    active = torch.tensor([0.0] * 4 + [1.0] * 8, dtype=torch.float64)
    weights = active / (2 * group_tokens)
    expected = (weights.unsqueeze(1) * per_token * mask).sum()

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; this calls the loss directly
    loss = trainer._compute_loss(trainer.model, inputs)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=1e-6)


def test_two_processes_make_the_same_decisions(tiny_model_path, tmp_path):
    worker = Path(__file__).with_name("dynamic_sampling_worker.py")
    run_torchrun(worker, tiny_model_path, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert reports[0]["decisions"] == reports[1]["decisions"]
    assert reports[0]["parameter_checksum"] == pytest.approx(reports[1]["parameter_checksum"], rel=0, abs=0)
    assert reports[0]["rows"] == reports[1]["rows"]
    assert reports[0]["steps"] == 2
    # The reward keeps different numbers of groups on the two ranks' halves of the first round.
    assert any(r > 1 for r in reports[0]["rounds"])


def test_completions_table_logs_what_each_row_trains_with(tiny_model_path, tmp_path):
    """TRL's completions table keeps one batch of rows; with several rounds they are the last round's, and each
    must show the advantage it trains with (0 for a dropped group), aligned with its prompt."""
    trainer, recorder = _build(
        tiny_model_path, flagged_prompts(12, 4), flagged_reward, output_dir=str(tmp_path), max_steps=1
    )
    trainer.train()
    prompts = [message_text(p) for p in trainer._logs["prompt"]]
    advantages = list(trainer._logs["advantages"])
    assert len(prompts) == len(advantages) == 8
    assert any("fixed" in prompt for prompt in prompts) and any("open" in prompt for prompt in prompts)
    for prompt, advantage in zip(prompts, advantages):
        if "fixed" in prompt:
            assert advantage == 0.0  # a fixed prompt's group is never informative
    trained = sorted(abs(a) for a in recorder.batches[0]["advantages"].tolist())
    logged_nonzero = sorted(abs(a) for a in advantages if a != 0.0)
    assert set(logged_nonzero) <= {round(a, 6) for a in trained} | set(trained)


def varied_format(completions, **kwargs) -> list[float]:
    """An auxiliary reward that differs between completions of every group."""
    return [(len(message_text(c)) % 3) / 2.0 for c in completions]


@pytest.mark.parametrize("dynamic_sampling", [False, True], ids=["zero_variance_filtering", "dynamic_sampling"])
def test_only_the_task_reward_decides_which_groups_train(tiny_model_path, tmp_path, dynamic_sampling):
    """Correctness + a format reward: a group whose correctness is all equal trains nothing even though the format
    reward (and so the combined reward) varies inside it; with the default task reward (all functions) it trains."""
    dataset = flagged_prompts(2, 2)
    batch = [dataset[i] for i in (0, 2) for _ in range(4)]  # "fixed 0": correctness all 1; "open 0": varied

    def active_rows(**task):
        trainer, _ = _build(
            tiny_model_path,
            flagged_prompts(8, 8),
            [flagged_reward, varied_format],
            config_class=tr.ReasoningConfig,
            trainer_class=tr.ReasoningTrainer,
            output_dir=str(tmp_path),
            zero_variance_filtering=not dynamic_sampling,
            dynamic_sampling=dynamic_sampling,
            max_num_gen_batches=1,
            **task,
        )
        trainer.model.train()
        torch.manual_seed(7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tr.DynamicSamplingWarning)  # one round cannot fill the batch
            inputs = trainer._generate_and_score_completions(batch)
        combined = trainer.last_train_batch.rewards.view(2, 4)
        assert all(len(set(group.tolist())) > 1 for group in combined)  # the combined reward varies in both
        # Rows may be regrouped (dynamic sampling stacks the kept groups first): name each row by its prompt.
        prompts = trainer.processing_class.batch_decode(inputs["prompt_ids"], skip_special_tokens=True)
        weights = trainer.last_train_batch.loss_weights
        return {"fixed" if "fixed" in text else "open" for text, w in zip(prompts, weights.tolist()) if w > 0}

    assert active_rows(task_reward_funcs=["flagged_reward"]) == {"open"}
    assert active_rows() == {"fixed", "open"}


def test_a_warning_during_training_points_at_the_users_line(tiny_model_path, tmp_path):
    trainer, _ = _build(
        tiny_model_path, flagged_prompts(4, 0), constant_reward, output_dir=str(tmp_path), max_steps=1,
        max_num_gen_batches=1,
    )  # fmt: skip
    with pytest.warns(tr.DynamicSamplingWarning) as record:
        trainer.train()
    assert {w.filename for w in record if w.category is tr.DynamicSamplingWarning} == {__file__}, "stacklevel"


@pytest.fixture
def replace_strategy():
    """A strategy the package does not ship, registered the way a user would (one class, one registry line): no extra
    generation; each uninformative group is replaced by a copy of an informative group of the same round (in the
    spirit of SkyRL's "replace" dynamic sampling), so every row of the batch trains."""

    @GROUP_SELECTIONS.register("replace_uninformative")
    class ReplaceUninformative(GroupSelection):
        regroup = True  # rows are rebuilt: a kept group may appear twice

        def select(self, informative, target):
            kept = [g for g, flag in enumerate(informative.tolist()) if flag]
            if not kept:  # nothing to copy: the batch trains nothing
                return list(range(target)), torch.zeros(target, dtype=torch.bool)
            return [g if informative[g] else kept[g % len(kept)] for g in range(target)], torch.ones(
                target, dtype=bool
            )

    yield "replace_uninformative"
    GROUP_SELECTIONS.unregister("replace_uninformative")


def test_a_registered_strategy_trains_by_its_config_name(tiny_model_path, tmp_path, replace_strategy):
    """The seam never names a strategy: `group_selection=<registered name>` on a plain ReasoningConfig is enough for
    a two-step run, and every group that trains is informative."""
    trainer, recorder = _build(
        tiny_model_path,
        flagged_prompts(2, 6),
        flagged_reward,
        config_class=tr.ReasoningConfig,
        trainer_class=tr.ReasoningTrainer,
        output_dir=str(tmp_path),
        group_selection=replace_strategy,
        max_steps=2,
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert len(recorder.batches) == 2
    for batch in recorder.batches:
        assert bool(batch["active"].all())
        assert bool(informative_groups(batch["rewards"], 4).all())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert logged_metric(trainer, "group_selection/groups_kept") and logged_metric(
        trainer, "group_selection/generation_rounds"
    ) == [1.0, 1.0]


def test_group_selection_names_must_be_registered_and_agree_with_the_switches(replace_strategy):
    with pytest.raises(ValueError, match="Unknown group_selection 'nope'. Allowed values: all, zero_variance"):
        tr.ReasoningConfig(**cpu_args(group_selection="nope"))
    with pytest.raises(ValueError, match="group_selection='replace_uninformative' contradicts dynamic_sampling=True"):
        tr.DAPOConfig(**cpu_args(group_selection=replace_strategy))
    tr.DAPOConfig(**cpu_args(group_selection=replace_strategy, dynamic_sampling=False))
    tr.DAPOConfig(**cpu_args(group_selection="dynamic"))
    with pytest.raises(ValueError, match="Unknown extra_round_size 'half'. Allowed values: keep_rate, full"):
        tr.DAPOConfig(**cpu_args(extra_round_size="half"))


class RoundSizes(TrainerCallback):
    """Keeps ``last_train_batch.generation_rounds`` of every step."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, []
        trainer.add_callback(self)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self.trainer.last_train_batch.generation_rounds)


@pytest.mark.parametrize("extra_round_size", ["keep_rate", "full"])
def test_extra_rounds_generate_what_the_keep_rate_says_is_missing(tiny_model_path, tmp_path, extra_round_size):
    # A full batch is 4 groups; most prompts are "open" (informative), so a step usually misses one or two groups,
    # which "keep_rate" generates (sized from the first round's keep rate) where "full" generates 4 groups again.
    trainer, recorder = _build(
        tiny_model_path, flagged_prompts(6, 10), flagged_reward, output_dir=str(tmp_path), max_steps=4,
        per_device_train_batch_size=16, extra_round_size=extra_round_size,
    )  # fmt: skip
    sizes = RoundSizes(trainer)
    trainer.train()
    assert len(sizes.steps) == 4 and any(len(rounds) > 1 for rounds in sizes.steps)
    for rounds, batch in zip(sizes.steps, recorder.batches):
        assert rounds[0][0] == 4 and batch["active"].all()  # the batch is full of informative groups either way
        for index in range(1, len(rounds)):
            kept, generated = (sum(r[i] for r in rounds[:index]) for i in (1, 0))
            expected = 4 if extra_round_size == "full" else extra_round_groups(kept, generated, 4, 4, 1, 4)
            assert rounds[index][0] == expected
    generated = logged_metric(trainer, "group_selection/groups_generated")
    assert generated == [float(sum(r[0] for r in rounds)) for rounds in sizes.steps]
    per_group = logged_metric(trainer, "group_selection/tokens_per_trained_group")
    tokens = logged_metric(trainer, "group_selection/generated_tokens")
    assert len(per_group) == 4 and all(t / 4 == pytest.approx(p) for t, p in zip(tokens, per_group))
    if extra_round_size == "keep_rate":
        assert any(rounds[i][0] < 4 for rounds in sizes.steps for i in range(1, len(rounds)))
