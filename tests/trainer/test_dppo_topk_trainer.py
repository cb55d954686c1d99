"""DPPO's top-K divergences inside the trainer: the stored rollout top-K, the loss-time forward, training runs."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch, make_prompts
from peft import LoraConfig

import trl_reasoning as tr
from trl_reasoning.algorithms.losses import compute_policy_loss, topk_divergence
from trl_reasoning.models.packing import PaddedRows


def _trainer(model_path, tmp_path, **overrides):
    args = tr.DPPOConfig(**cpu_args(output_dir=str(tmp_path), **overrides))
    return tr.DPPOTrainer(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())


@pytest.mark.parametrize("divergence", ["topk_tv", "topk_kl"])
def test_generation_stores_the_rollout_top_k(tiny_model_path, tmp_path, divergence):
    trainer = _trainer(tiny_model_path, tmp_path, dppo_divergence=divergence, dppo_topk=5, temperature=0.7)
    batch = generate_batch(trainer)
    ids, logps = batch["rollout_topk_ids"], batch["rollout_topk_logps"]
    completion_ids = batch["completion_ids"]
    assert ids.shape == logps.shape == (*completion_ids.shape, 5)
    assert ids.dtype == torch.long

    # Reference: the full distribution of the same model at temperature 0.7, float64.
    input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = trainer.model(input_ids=input_ids, attention_mask=mask).logits.double()
    t = completion_ids.shape[1]
    full = torch.log_softmax(logits[:, -t - 1 : -1] / 0.7, dim=-1)
    valid = batch["completion_mask"].bool()
    # packed (padding_free's default), only the completion tokens are scored; padding holds NaN: no position
    torch.testing.assert_close(logps.double()[valid], full.gather(-1, ids)[valid], rtol=1e-4, atol=1e-5)
    assert torch.isnan(logps[~valid]).all()
    assert (ids == completion_ids.unsqueeze(-1)).any(-1)[valid].all()  # the sampled token is always present
    # The memory-bounded path (hidden states x LM head, no [B, T, V] logits) is the one taken for this model.
    _, head, _ = trainer.topk_forward._final_hidden_states(trainer.model, PaddedRows(input_ids, mask, t), False)
    assert head is not None


def test_loss_uses_the_top_k_divergence_and_matches_the_formula(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, dppo_divergence="topk_tv", dppo_topk=4)
    batch = generate_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    # Move the policy so the divergence is non-trivial.
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss = trainer._compute_loss(trainer.model, batch)

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = trainer.model(input_ids=input_ids, attention_mask=mask).logits
    t = batch["completion_ids"].shape[1]
    full = torch.log_softmax(logits[:, -t - 1 : -1].float() / trainer.temperature, dim=-1)
    logps = full.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    topk = full.gather(-1, batch["rollout_topk_ids"])
    old = batch.get("old_per_token_logps", logps.detach())
    per_token = compute_policy_loss(
        "dppo",
        logps,
        old,
        batch["advantages"].unsqueeze(1),
        batch["completion_mask"],
        divergence="topk_tv",
        rollout_topk_logps=batch["rollout_topk_logps"],
        topk_logps=topk,
    )
    expected = (batch["loss_weights"].unsqueeze(1) * per_token * batch["completion_mask"]).sum()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-6)
    d = topk_divergence(batch["rollout_topk_logps"], topk.detach(), kind="tv", mask=batch["completion_mask"])
    assert d[batch["completion_mask"].bool()].max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("use_lora", [False, True])
def test_dppo_top_k_trains(tiny_model_path, tmp_path, use_lora):
    args = tr.DPPOConfig(**cpu_args(output_dir=str(tmp_path), dppo_divergence="topk_kl"))
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if use_lora else None
    trainer = tr.DPPOTrainer(
        model=tiny_model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(),
        peft_config=peft_config,
    )
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert any("dppo/divergence_mean" in entry for entry in trainer.state.log_history)
    moved = [n for n, p in trainer.model.named_parameters() if n in trainable and not torch.equal(p, trainable[n])]
    assert moved


def test_entropy_bonus_with_top_k_is_rejected():
    with pytest.raises(ValueError, match="entropy_coef / use_adaptive_entropy need the entropy's gradient"):
        tr.DPPOConfig(**cpu_args(dppo_divergence="topk_tv", entropy_coef=0.01))


def test_dppo_topk_must_be_positive():
    with pytest.raises(ValueError, match="dppo_topk must be an int >= 1, got 0"):
        tr.DPPOConfig(**cpu_args(dppo_topk=0))


def test_a_head_that_cannot_be_applied_falls_back_to_the_logits_path(tiny_model_path, tmp_path, monkeypatch):
    """A sharded LM head (ZeRO-3 leaves an empty placeholder outside the forward) must not crash: the loss then comes
    from the model's own logits, and equals the hidden-state path's."""
    trainer = _trainer(tiny_model_path, tmp_path, dppo_divergence="topk_tv", dppo_topk=4)
    batch = generate_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    expected = trainer._compute_loss(trainer.model, batch)

    class ShardedView:  # what unwrap_model shows under ZeRO-3: the config, and a head without its weight
        config = trainer.model.config

        def get_output_embeddings(self):
            return torch.nn.Linear(0, 0, bias=False)

    fallback_calls = []
    original = trainer.topk_forward._completion_logits

    def spy(*args, **kwargs):
        fallback_calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer, "_bare_model", lambda model=None: ShardedView())
    monkeypatch.setattr(trainer.topk_forward, "_completion_logits", spy)
    loss = trainer._compute_loss(trainer.model, batch)
    assert fallback_calls
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-6)
    # later steps go straight to the logits, without the wasted forward
    assert not trainer.topk_forward.lm_head_from_hidden


def test_the_per_step_forward_does_not_unwrap_the_model_every_time(tiny_model_path, tmp_path, monkeypatch):
    """accelerate's ``unwrap_model`` reads installed packages' metadata on each call (~1 ms, 3 calls per top-K forward
    before): the bare model is looked up once per wrapper."""
    trainer = _trainer(tiny_model_path, tmp_path, dppo_divergence="topk_tv", dppo_topk=4)
    batch = generate_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    unwraps = []
    original = trainer.accelerator.unwrap_model
    monkeypatch.setattr(trainer.accelerator, "unwrap_model", lambda *a, **k: unwraps.append(1) or original(*a, **k))
    first = trainer._compute_loss(trainer.model, batch)
    trainer.check_context_length(batch)
    second = trainer._compute_loss(trainer.model, batch)
    torch.testing.assert_close(first, second)
    assert len(unwraps) <= 1
