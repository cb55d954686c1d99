"""The sampler's log-probs read from HF ``generate``'s own scores (inline and process generators: no second forward),
and the policy scored on the sampler's truncated support (``truncated_support_scoring``): ratio 1 at lag 0."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch, logged_metric, make_prompts
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from trl import GRPOTrainer

import trl_reasoning as tr
from trl_reasoning.algorithms.losses import clip_loss
from trl_reasoning.algorithms.truncation import SamplingTruncation, truncated_log_probs
from trl_reasoning.async_rollouts.hf_sampling import SamplingSettings, sample
from trl_reasoning.trainer.rollout import loss_tokens

SAMPLING = dict(temperature=0.7, top_p=0.9, top_k=20)


def _forward_logps(model, prompt_ids, completion_ids, temperature, truncation):
    """Independent recomputation: each sequence alone, no padding, float64, the sampler's truncation applied."""
    rows = []
    with torch.no_grad():
        for prompt, completion in zip(prompt_ids, completion_ids, strict=True):
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            rows.append(truncated_log_probs(logits.double() / temperature, torch.tensor(completion), truncation))
    return rows


def _counting_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


def _trainer(model_path, tmp_path, **overrides):
    settings = dict(async_rollouts=True, max_staleness=0, max_steps=1, **SAMPLING)
    settings.update(overrides)
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), **settings))
    return tr.ReasoningTrainer(model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())


# ----------------------------------------------------------------------------------------------- mu from the scores


@pytest.mark.parametrize("truncated", [True, False], ids=["top_p-top_k", "temperature-only"])
def test_inline_sampler_logps_are_the_scores_and_need_no_forward(truncated, tiny_model_path, tmp_path):
    sampling = SAMPLING if truncated else dict(temperature=0.7, top_p=1.0, top_k=0)
    trainer = _trainer(tiny_model_path, tmp_path, **sampling)
    scored_by_forward = []
    trainer.behaviour_logps = lambda output: scored_by_forward.append(1)
    generated = []
    generate = trainer._generate

    def recorded(prompts):
        calls, handle = _counting_forwards(trainer.model)
        try:
            output = generate(prompts)
        finally:
            handle.remove()
        generated.append((output, len(calls)))
        return output

    trainer._generate = recorded
    trainer.model.train()
    batch = [make_prompts()[i] for i in range(2) for _ in range(trainer.num_generations)]
    trainer._generate_and_score_completions(batch)
    ((output, forwards),) = generated
    prompt_ids, completion_ids, logps = output[0], output[1], output[4]
    assert not scored_by_forward
    # one forward per sampled position, none after: the log-probs came from generate's scores
    assert forwards == max(len(ids) for ids in completion_ids)
    truncation = SamplingTruncation(top_k=sampling["top_k"], top_p=sampling["top_p"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    want = _forward_logps(model, prompt_ids, completion_ids, 0.7, truncation)
    for row, expected in zip(logps, want, strict=True):
        torch.testing.assert_close(torch.tensor(row, dtype=torch.float64), expected, atol=1e-4, rtol=1e-4)
    if truncated:  # the truncated distribution's, which the full vocabulary's would not match
        full = _forward_logps(model, prompt_ids, completion_ids, 0.7, SamplingTruncation())
        assert max(float((torch.tensor(r) - f).abs().max()) for r, f in zip(logps, full)) > 1e-2


def test_the_worker_reads_its_sampler_logps_from_the_scores_of_its_one_generate(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    truncation = SamplingTruncation(top_k=20, top_p=0.9)
    config = GenerationConfig(
        max_new_tokens=12,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    settings = SamplingSettings(
        generation_config=config,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
        temperature=0.7,
        pad_to_multiple_of=None,
        batch_size=4,
    )
    prompt_ids = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    calls, handle = _counting_forwards(model)
    torch.manual_seed(0)
    try:
        completions, logps = sample(model, prompt_ids, settings)
    finally:
        handle.remove()
    assert len(calls) == max(len(ids) for ids in completions), "a forward ran besides generate's own"
    want = _forward_logps(model, prompt_ids, completions, 0.7, truncation)
    for row, expected in zip(logps, want, strict=True):
        torch.testing.assert_close(torch.tensor(row, dtype=torch.float64), expected, atol=1e-4, rtol=1e-4)
    assert not hasattr(vars(model), "generate") and "generate" not in vars(model), "generate was left wrapped"


# --------------------------------------------------------------------------------- the ratio on the truncated support


@pytest.mark.parametrize("pi_old_from_loss", [True, False], ids=["pi_old-from-loss", "pi_old-from-trl-forward"])
def test_at_lag_0_the_ratio_on_the_truncated_support_is_exactly_1(pi_old_from_loss, tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        vllm_importance_sampling_mode="token_truncate",
        importance_sampling_pi_old_from_loss=pi_old_from_loss,
        ratio_anchor="pi_old",  # TRL's correction between pi_old and mu is what this checks
    )
    assert trainer.args.truncated_support_scoring is True, "None did not resolve to on for a truncating sampler"
    inputs = generate_batch(trainer)
    mask = loss_tokens(inputs).float()
    mu = inputs["sampling_per_token_logps"]
    logps, _, _, _ = trainer._policy_forward(trainer.model, inputs)
    # The correction between pi_old (on the support) and mu: built in the loss from its own forward's log-probs, or
    # by TRL at scoring from its own no-grad forward
    if pi_old_from_loss:
        assert "importance_sampling_ratio" not in inputs, "TRL built the correction: its pi_old forward ran"
        ratio = trainer.correction.weight(logps.detach(), mu, mask)
    else:
        ratio = inputs["importance_sampling_ratio"]
    torch.testing.assert_close(ratio * mask, mask, atol=2e-5, rtol=0)
    torch.testing.assert_close(((logps - mu) * mask).exp(), torch.ones_like(mask), atol=2e-5, rtol=0)
    # the loss has the untruncated on-policy loss's form: clip(ratio 1) * A, times a correction of 1
    advantages = inputs["advantages"].unsqueeze(1)
    per_token, _, _ = trainer._per_token_objective(inputs, logps, None, mask, None)
    want = clip_loss(logps, logps.detach(), advantages, mask, trainer.epsilon_low, trainer.epsilon_high)
    torch.testing.assert_close(per_token * mask, want * mask, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad((per_token * mask).sum(), logps, retain_graph=True)
    torch.testing.assert_close(grad, -advantages.expand_as(mask) * mask, atol=1e-5, rtol=1e-5)


def test_with_the_switch_off_the_policy_is_scored_as_trl_scores_it(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, truncated_support_scoring=False)
    inputs = generate_batch(trainer)
    mask = loss_tokens(inputs).float()
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    length = inputs["completion_ids"].size(1)
    ours, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, length)
    trl, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, trainer.model, input_ids, attention_mask, length
    )
    assert torch.equal(ours, trl)
    # TRL's biased ratio: the full vocabulary's probability is below the truncated one on every kept token
    ratio = ((ours - inputs["sampling_per_token_logps"]) * mask).exp()
    assert float(ratio.detach()[mask.bool()].max()) < 1.0 - 1e-3


def test_the_switch_is_checked_at_construction():
    with pytest.raises(ValueError, match="does not truncate"):
        tr.ReasoningConfig(**cpu_args(), truncated_support_scoring=True)
    with pytest.raises(ValueError, match="truncated_support_scoring=False"):
        tr.ReasoningConfig(**cpu_args(), truncated_support_scoring=True, top_p=0.9, entropy_coef=0.01)
    with pytest.raises(ValueError, match="truncated_support_scoring"):
        tr.ReasoningConfig(**cpu_args(), truncated_support_scoring="maybe", top_p=0.9)
    assert tr.ReasoningConfig(**cpu_args()).truncated_support_scoring is False
    # on by default where the sampler's log-probs meet the policy's in a ratio: vLLM or asynchronous rollouts
    for where in ({"use_vllm": True}, {"async_rollouts": True}):
        config = tr.ReasoningConfig(**cpu_args(), generation_kwargs={"min_p": 0.1}, **where)
        assert config.truncated_support_scoring is True, where
    # a synchronous run sampled by generate keeps TRL's objective unless asked
    assert tr.ReasoningConfig(**cpu_args(), top_p=0.9).truncated_support_scoring is False
    assert tr.ReasoningConfig(**cpu_args(), top_p=0.9, truncated_support_scoring=True).truncated_support_scoring
    with pytest.warns(UserWarning, match="scored on the whole vocabulary"):
        config = tr.DPPOConfig(**cpu_args(), top_k=20, dppo_divergence="topk_tv", use_vllm=True)
    assert config.truncated_support_scoring is False


def test_a_short_run_with_truncated_sampling_trains(tiny_model_path, tmp_path):
    args = tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path), max_steps=3, truncated_support_scoring=True, **SAMPLING))
    assert args.truncated_support_scoring is True
    trainer = tr.DAPOTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    losses = logged_metric(trainer, "loss")
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    moved = sum(float((param.detach() - before[name]).abs().max()) for name, param in trainer.model.named_parameters())
    assert moved > 0
