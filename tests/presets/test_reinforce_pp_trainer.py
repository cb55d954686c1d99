"""REINFORCE++ in the trainer: the batch carries one advantage per completion token, computed from the batch's own
pi_old and reference log-probs (k1 KL in the return, no KL term in the loss), and a run trains."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import Recorder, cpu_args, digit_fraction, generate_batch, logged_metric, message_text, run_torchrun
from datasets import Dataset

import trl_reasoning as tr
from trl_reasoning.algorithms.advantages import compute_advantages, per_completion
from trl_reasoning.algorithms.shaping import token_kl
from trl_reasoning.trainer.rollout import loss_tokens


def _trainer(tiny_model_path, prompts, tmp_path, trainer_cls=tr.ReinforcePPTrainer, **overrides):
    args = trainer_cls.config_class(**cpu_args(output_dir=str(tmp_path), **overrides))
    return trainer_cls(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=prompts)


@pytest.mark.parametrize("estimator", ["reinforce_pp_baseline", "reinforce_pp"])
def test_the_batch_holds_the_estimator_of_its_own_kl_and_rewards(estimator, tiny_model_path, prompts, tmp_path):
    # beta large enough for the KL to matter once the policy has moved off the reference
    trainer = _trainer(tiny_model_path, prompts, tmp_path, advantage_estimator=estimator, beta=0.5)
    with torch.no_grad():  # move the policy off the reference, so that the KL is not 0
        for param in trainer.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    output = generate_batch(trainer)
    mask = loss_tokens(output)
    advantages, batch = output["advantages"], trainer.last_train_batch
    assert advantages.shape == mask.shape
    kl = token_kl(output["old_per_token_logps"], output["ref_per_token_logps"], mask)
    assert kl.abs().sum() > 0, "no KL: the test cannot tell a per-token return from a broadcast reward"
    expected = compute_advantages(
        batch.rewards, trainer.num_generations, estimator, completion_mask=mask, token_kl=kl, beta=0.5
    )
    torch.testing.assert_close(advantages, expected.to(advantages.dtype), rtol=1e-5, atol=1e-6)
    assert torch.equal(batch.advantages, advantages)  # one process: the gathered batch is this one
    assert not advantages[mask == 0].any(), "padding got an advantage"
    varies = [len(set(row[m.bool()].tolist())) > 1 for row, m in zip(advantages, mask)]
    assert any(varies), "with beta > 0 the advantages should vary along a completion"
    # the completions table: one number per completion, its first token's
    logged = list(trainer._logs["advantages"])[-advantages.shape[0] :]
    assert logged == pytest.approx(per_completion(advantages).tolist())
    # the metrics average the counted tokens only; the KL is logged from the return
    assert trainer._metrics["train"]["advantages/mean"][-1] == pytest.approx(advantages[mask.bool()].mean().item())
    assert trainer._metrics["train"]["kl"][-1] == pytest.approx((kl.sum() / mask.sum()).item(), rel=1e-5)


def test_no_kl_term_is_added_to_the_loss(tiny_model_path, prompts, tmp_path):
    # The same batch with the same advantages: a beta of 0.5 must not add TRL's k3 term (the KL is in the return).
    trainer = _trainer(tiny_model_path, prompts, tmp_path, beta=0.5)
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    output = generate_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, output)
        trainer.beta = 0.0
        without = trainer._compute_loss(trainer.model, output)
    assert loss.item() == pytest.approx(without.item(), abs=1e-7)


@pytest.mark.slow
def test_reinforce_pp_trains_with_per_token_advantages(tiny_model_path, prompts, tmp_path):
    trainer = _trainer(tiny_model_path, prompts, tmp_path, beta=0.5)
    recorder = Recorder(trainer)
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = logged_metric(trainer, "loss")
    assert len(losses) == trainer.args.max_steps and all(math.isfinite(loss) for loss in losses), losses
    assert any(not torch.equal(p, trainable[n]) for n, p in trainer.model.named_parameters() if n in trainable)
    assert all(batch["advantages"].dim() == 2 for batch in recorder.batches)
    # the first batch is sampled from the reference itself (KL 0); once the policy moved, the return varies along t
    later = recorder.batches[-1]["advantages"]
    assert any(len(set(row[row != 0].tolist())) > 1 for row in later), "no advantage varied along its completion"
    assert all(kl != 0 for kl in logged_metric(trainer, "kl")[1:]), logged_metric(trainer, "kl")


def _fixed_or_open_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 for a "fixed" prompt (its group is never informative); otherwise a value that differs between completions."""
    return [
        1.0 if message_text(p).startswith("fixed") else (sum(map(ord, message_text(c))) % 11) / 10.0
        for p, c in zip(prompts, completions)
    ]


@pytest.mark.slow
def test_dynamic_sampling_regroups_per_token_advantages(tiny_model_path, tmp_path):
    # 3 of 4 prompts are "fixed": the batch is regrouped from several generation rounds, its advantages per token.
    rows = [f"fixed {i}" for i in range(12)] + [f"open {i}" for i in range(4)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in rows])
    args = tr.ReinforcePPConfig(**cpu_args(output_dir=str(tmp_path), max_steps=2), dynamic_sampling=True, beta=0.5)
    trainer = tr.ReinforcePPTrainer(
        model=tiny_model_path, reward_funcs=_fixed_or_open_reward, args=args, train_dataset=dataset
    )
    recorder = Recorder(trainer)
    trainer.train()
    assert max(logged_metric(trainer, "group_selection/generation_rounds")) > 1, "no regrouping: the test is vacuous"
    assert all(math.isfinite(loss) for loss in logged_metric(trainer, "loss"))
    for batch in recorder.batches:
        assert batch["advantages"].dim() == 2 and batch["active"].all()
    # the completions table: the last round's rows, each with the first-token advantage it trains with (0 if dropped)
    first_tokens = {round(a, 5) for a in per_completion(recorder.batches[-1]["advantages"]).tolist()}
    logged = [a for a in trainer._logs["advantages"] if a != 0.0]
    assert logged and {round(a, 5) for a in logged} <= first_tokens


@pytest.mark.slow
def test_two_processes_normalise_over_the_batch_of_both(tiny_model_path, tmp_path):
    """Each rank's completions are padded to its own longest one; the estimator reads both ranks' rows padded to the
    longest of all, and each rank trains on its rows of the result, cut back to its own width."""
    run_torchrun(Path(__file__).with_name("reinforce_pp_worker.py"), tiny_model_path, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["steps"] for r in reports] == [3, 3]
    assert reports[0]["parameter_checksum"] == reports[1]["parameter_checksum"]
    widths_differ = False
    for batch_0, batch_1 in zip(reports[0]["batches"], reports[1]["batches"], strict=True):
        for key in ("mask", "kl", "rewards", "advantages"):
            assert batch_0[key] == batch_1[key], f"the ranks disagree on the gathered {key}"
        mask, kl = torch.tensor(batch_0["mask"]), torch.tensor(batch_0["kl"])
        expected = compute_advantages(
            torch.tensor(batch_0["rewards"]), 4, "reinforce_pp_baseline", completion_mask=mask, token_kl=kl, beta=0.5
        )
        torch.testing.assert_close(torch.tensor(batch_0["advantages"]), expected)
        rows = len(batch_0["local"])
        for rank, batch in enumerate((batch_0, batch_1)):
            local = torch.tensor(batch["local"])
            width = local.shape[1]
            torch.testing.assert_close(local, expected[rank * rows : (rank + 1) * rows, :width])
            assert not expected[rank * rows : (rank + 1) * rows, width:].any(), "a rank lost a counted token"
        widths_differ |= len(batch_0["local"][0]) != len(batch_1["local"][0])
    assert widths_differ, "the ranks' completions always had the same width: the padding across ranks went untested"
