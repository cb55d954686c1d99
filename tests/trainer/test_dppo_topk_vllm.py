"""DPPO top-K anchored to the engine that sampled: with vLLM, the stored top-K is vLLM's own processed log-probs.

vLLM cannot run here (no CUDA). These tests replace TRL's ``VLLMGeneration`` with a stand-in that has its interface
and returns vLLM-shaped outputs (``logprobs=K``: the top-K entries ranked, plus the sampled token when it ranks lower),
sampling from the tiny model itself. The plumbing is tested at TRL's interface; a real vLLM is not.
"""

from __future__ import annotations

import math

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from conftest import cpu_args, digit_fraction, generate_batch, make_prompts

import trl_reasoning as tr
from trl_reasoning.algorithms.logprobs import engine_sampled_logprobs, rollout_topk_from_engine

# ---------------------------------------------------------------------------------------------------- pure function


def test_engine_topk_keeps_ranked_entries_and_swaps_in_the_sampled_token():
    completion_ids = [[3, 4], [9]]
    token_ids = [[[5, 3, 9], [7, 2, 8, 4]], [[9, 1]]]  # position (0, 1): the sampled 4 ranks 4th, after the top-3
    logprobs = [[[-0.1, -2.0, -3.0], [-0.5, -1.5, -2.5, -4.0]], [[-0.2, None]]]
    ids, logps = rollout_topk_from_engine(completion_ids, logprobs, token_ids, k=2, length=3, pad_token_id=0)
    assert ids.tolist() == [[[5, 3], [7, 4], [0, 0]], [[9, 1], [0, 0], [0, 0]]]
    expected = [
        [[-0.1, -2.0], [-0.5, -4.0], [math.nan, math.nan]],
        [[-0.2, math.nan], [math.nan, math.nan], [math.nan, math.nan]],
    ]
    torch.testing.assert_close(logps, torch.tensor(expected), equal_nan=True)
    assert engine_sampled_logprobs(completion_ids, logprobs, token_ids) == [[-2.0, -4.0], [-0.2]]


def test_engine_topk_defaults_to_the_longest_sequence():
    ids, logps = rollout_topk_from_engine([[1], [2, 3]], [[[-1.0]], [[-1.0], [-2.0]]], [[[1]], [[2], [3]]], k=1)
    assert ids.shape == logps.shape == (2, 2, 1)


@pytest.mark.parametrize(
    ("completion_ids", "logprobs", "token_ids", "k", "message"),
    [
        ([[3]], [[[-1.0]]], [[[3]]], 2, "reported 1 log-probs, fewer than k=2"),
        ([[3]], [[[-1.0, -2.0]]], [[[5, 6]]], 2, "sampled token 3 is not among"),
        ([[3, 4]], [[[-1.0]]], [[[3]]], 1, "2 completion tokens but log-probs for 1"),
        ([[3]], [], [], 1, "hold 1, 0 and 0 sequences"),
    ],
)
def test_engine_topk_rejects_outputs_that_do_not_fit(completion_ids, logprobs, token_ids, k, message):
    with pytest.raises(ValueError, match=message):
        rollout_topk_from_engine(completion_ids, logprobs, token_ids, k=k)


# ---------------------------------------------------------------------------------------------------- the stand-in


class VLLMShapedGeneration:
    """Stand-in for ``trl.generation.vllm_generation.VLLMGeneration``: built with the same keyword arguments, reads
    ``self.logprobs`` at each call like the real one, and returns ``(prompt_ids, completion_ids, logprobs,
    logprob_token_ids)`` ranked as vLLM does. Its engine is the tiny model itself, sampled at TRL's temperature; each
    sequence stops at EOS or at a random stop length (so batches have padding)."""

    def __init__(self, *, model, temperature, max_completion_length, logprobs, **kwargs):
        self.model, self.temperature, self.max_length, self.logprobs = (
            model,
            temperature,
            max_completion_length,
            logprobs,
        )
        self.eos_token_id = kwargs["processing_class"].eos_token_id
        self.generator = torch.Generator().manual_seed(7)
        self.full_logps: list[torch.Tensor] = []  # per generated sequence, [length, vocab]: what the engine saw
        self.requested: list[int | None] = []

    def sync_weights(self):
        pass

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        self.requested.append(self.logprobs)
        completion_ids, logprobs, token_ids = [], [], []
        for prompt in prompts:
            stop = int(torch.randint(2, self.max_length + 1, (), generator=self.generator))
            ids, seq_logps, seq_ids, rows = [], [], [], []
            while len(ids) < stop:
                logits = self.model(input_ids=torch.tensor([prompt + ids])).logits[0, -1].double()
                full = torch.log_softmax(logits / self.temperature, dim=-1)
                token = int(torch.multinomial(full.exp(), 1, generator=self.generator))
                ranked = torch.argsort(full, descending=True).tolist()
                entries = ranked[: max(self.logprobs, 1)] if self.logprobs else [token]
                if token not in entries:
                    entries.append(token)  # vLLM adds the sampled token after the top-K
                ids.append(token)
                seq_ids.append(entries)
                seq_logps.append([float(full[e]) for e in entries])
                rows.append(full)
                if token == self.eos_token_id:
                    break
            completion_ids.append(ids)
            logprobs.append(seq_logps)
            token_ids.append(seq_ids)
            self.full_logps.append(torch.stack(rows))
        return prompts, completion_ids, logprobs, token_ids


@pytest.fixture
def vllm_standin(monkeypatch):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", VLLMShapedGeneration)


def _dppo_trainer(model_path, tmp_path, **overrides):
    settings = dict(use_vllm=True, vllm_mode="colocate", dppo_divergence="topk_tv", dppo_topk=3, temperature=0.8)
    args = tr.DPPOConfig(**cpu_args(output_dir=str(tmp_path), **{**settings, **overrides}))
    return tr.DPPOTrainer(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())


def test_stored_top_k_is_the_engines_own(vllm_standin, tiny_model_path, tmp_path):
    trainer = _dppo_trainer(tiny_model_path, tmp_path)
    engine = trainer.vllm_generation
    batch = generate_batch(trainer)
    assert engine.requested == [3]  # asked the engine for its top-3, not TRL's logprobs=0

    ids, logps, mask = batch["rollout_topk_ids"], batch["rollout_topk_logps"], batch["completion_mask"].bool()
    assert ids.shape == logps.shape == (*batch["completion_ids"].shape, 3)
    swapped = 0
    for row, full in enumerate(engine.full_logps):
        length = full.shape[0]
        sampled = batch["completion_ids"][row, :length]
        top = torch.argsort(full, dim=-1, descending=True)[:, :3]
        absent = ~(top == sampled.unsqueeze(-1)).any(-1)
        top[absent, -1] = sampled[absent]  # the sampled token takes the K-th slot when it ranks lower
        swapped += int(absent.sum())
        assert torch.equal(ids[row, :length], top)
        torch.testing.assert_close(logps[row, :length].double(), full.gather(-1, top), atol=1e-6, rtol=1e-6)
        assert torch.isnan(logps[row, length:]).all()  # padding: ignored by the divergence
        # TRL's importance-sampling log-probs are the sampled token's, not the top-ranked entry's.
        torch.testing.assert_close(
            batch["sampling_per_token_logps"][row, :length].double(), full.gather(-1, sampled[:, None])[:, 0]
        )
    assert swapped > 0 and not mask.all()  # both the swap and the padding were exercised


def test_padding_and_unscored_positions_do_not_reach_the_loss(vllm_standin, tiny_model_path, tmp_path):
    trainer = _dppo_trainer(tiny_model_path, tmp_path)
    batch = generate_batch(trainer)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in trainer.model.parameters() if p.grad is not None)


def test_training_with_the_engine_top_k(vllm_standin, tiny_model_path, tmp_path):
    trainer = _dppo_trainer(tiny_model_path, tmp_path, max_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(v) for v in losses)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert len(trainer.vllm_generation.requested) >= 2


def test_without_the_engine_the_model_forward_is_kept(tiny_model_path, tmp_path):
    args = tr.DPPOConfig(**cpu_args(output_dir=str(tmp_path)), dppo_divergence="topk_tv", dppo_topk=3)
    trainer = tr.DPPOTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    assert trainer._engine_topk is None
    batch = generate_batch(trainer)
    valid = batch["completion_mask"].bool()
    # HF path: finite values at every completion token (packed, padding holds NaN: no position)
    assert not torch.isnan(batch["rollout_topk_logps"][valid]).any()


def test_asynchronous_rollouts_sync_the_engine_with_the_behaviour_weights(vllm_standin, tiny_model_path, tmp_path):
    """With vLLM, the engine samples from the behaviour weights (synced before each training generation, and again
    before the next one), its own log-probs and top-K are the sampler's: nothing is recomputed by the trainer."""
    trainer = _dppo_trainer(tiny_model_path, tmp_path, max_steps=3, async_rollouts=True, max_staleness=1)
    engine = trainer.vllm_generation
    seen = []

    def sync_weights():  # the stand-in's engine is the model itself: record what it holds when synced
        seen.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})

    engine.sync_weights = sync_weights

    def recomputed(*args, **kwargs):
        raise AssertionError("the trainer recomputed log-probs that vLLM returned")

    trainer.async_rollouts._sampled_token_logps = recomputed
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert [e["async/staleness"] for e in trainer.state.log_history if "async/staleness" in e] == [0, 1, 1]
    assert len(seen) == 3
    # k = 1: steps 1 and 2 are sampled by the initial weights, step 3 by the weights after step 1.
    for name, before in start.items():
        assert torch.equal(seen[0][name], before) and torch.equal(seen[1][name], before)
    assert any(not torch.equal(seen[2][name], start[name]) for name in start)


def test_a_synchronous_vllm_run_with_a_setting_it_cannot_repeat_keeps_trl_s_behaviour_and_warns_once(
    vllm_standin, tiny_model_path, tmp_path
):
    """TRL accepts a repetition penalty on its vLLM path: so does this package, and says once that the sampler's
    log-probabilities then carry a processor the policy's do not (tests/async_rollouts/test_sampler_settings.py)."""
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), use_vllm=True, vllm_mode="colocate", repetition_penalty=1.3, max_steps=1)
    )
    with pytest.warns(
        UserWarning, match=r"sampler's log-probabilities enter the loss.*repetition_penalty=1.3"
    ) as caught:
        trainer = tr.ReasoningTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
    assert sum("repetition_penalty=1.3" in str(w.message) for w in caught) == 1
    assert trainer.async_rollouts is None
