"""Padding-free batches: the packed layout against hand-computed values, the row groups, and the packed attention of
several model families against their padded forward (values and gradients, float32 and bfloat16)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from trl.trainer.utils import add_fused_lm_head

from trl_reasoning.models import varlen_attention
from trl_reasoning.models.packing import (
    IGNORE_INDEX,
    PaddedRows,
    balanced_groups,
    pack_rows,
    packable,
    token_budget_groups,
)

# Three rows, prompts left-padded to 3 columns, completions right-padded to 3: lengths 2+2, 3+3, 1+0.
INPUT_IDS = torch.tensor(
    [
        [0, 11, 12, 13, 14, 0],
        [21, 22, 23, 24, 25, 26],
        [0, 0, 31, 0, 0, 0],
    ]
)
MASK = torch.tensor(
    [
        [0, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0],
    ]
)


def test_pack_rows_by_hand():
    packed = pack_rows(INPUT_IDS, MASK, num_scored=3)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24, 25, 26, 31]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0]]
    assert packed.cu_seq_lens.tolist() == [0, 4, 10, 11]
    assert packed.cu_seq_lens.dtype == torch.int32
    assert packed.max_length == 6
    # position 1 (token 12) predicts 13, the first completion token of row 0; row 2 has no completion token
    ignore = IGNORE_INDEX
    assert packed.shift_labels.tolist() == [[ignore, 13, 14, ignore, ignore, ignore, 24, 25, 26, ignore, ignore]]
    assert packed.scored_positions.tolist() == [1, 2, 6, 7, 8]
    assert packed.scored_rows.tolist() == [0, 0, 1, 1, 1]
    assert packed.scored_columns.tolist() == [0, 1, 0, 1, 2]


def test_unpack_and_gather_are_inverse_and_differentiable():
    packed = pack_rows(INPUT_IDS, MASK, num_scored=3)
    values = torch.arange(11, dtype=torch.float32).unsqueeze(0).requires_grad_()
    padded = packed.unpack(values, fill=-1.0)
    assert padded.tolist() == [[1.0, 2.0, -1.0], [6.0, 7.0, 8.0], [-1.0, -1.0, -1.0]]
    assert packed.gather(padded).tolist() == [1.0, 2.0, 6.0, 7.0, 8.0]
    padded.sum().backward()
    assert values.grad.tolist() == [[0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]]
    # the layout protocol: scoring states [1, M], targets [1, M], restored [B, C]
    assert packed.scoring_states(values).shape == (1, 5)
    assert packed.scoring_targets(INPUT_IDS[:, 3:]).tolist() == [[13, 14, 24, 25, 26]]
    assert packed.restore(packed.scoring_states(values)).shape == (3, 3)


def test_a_subset_of_rows_packs_alone():
    packed = pack_rows(INPUT_IDS, MASK, num_scored=3, rows=[2, 0])
    assert packed.rows.tolist() == [2, 0]
    assert packed.input_ids.tolist() == [[31, 11, 12, 13, 14]]
    assert packed.scored_rows.tolist() == [0, 0] and packed.scored_columns.tolist() == [0, 1]
    assert packed.unpack(torch.ones(1, 5)).shape == (3, 3)


def test_padded_rows_follow_the_same_protocol():
    padded = PaddedRows(INPUT_IDS, MASK, num_scored=3)
    assert padded.positions_to_keep == 4
    states = torch.arange(6).view(1, 6).expand(3, 6)
    assert padded.scoring_states(states).tolist() == [[2, 3, 4]] * 3  # the positions before columns 3, 4, 5
    assert padded.restore(states) is states


def test_layouts_without_a_packed_twin_are_named():
    assert packable(MASK, 3) is None
    holes = MASK.clone()
    holes[1, 2] = 0
    assert "row 1 has padding between its real tokens" in packable(holes, 3)
    no_prompt = torch.tensor([[0, 0, 1, 1]])
    assert "row 0 has no prompt token" in packable(no_prompt, 2)


def test_token_budget_groups():
    assert token_budget_groups([3, 4, 2, 9, 1], budget=7) == [[0, 1], [2], [3], [4]]
    assert token_budget_groups([3, 4, 2, 9, 1], budget=100) == [[0, 1, 2, 3, 4]]
    assert token_budget_groups([], budget=5) == []
    with pytest.raises(ValueError, match="budget"):
        token_budget_groups([1], budget=0)


def test_balanced_groups():
    groups = balanced_groups([10, 1, 1, 1, 9, 2], parts=2)
    assert sorted(row for group in groups for row in group) == list(range(6))
    assert sorted(sum([10, 1, 1, 1, 9, 2][row] for row in group) for group in groups) == [12, 12]
    # every part gets a row, even when the lengths would pile them on one
    assert balanced_groups([100, 1, 1], parts=3) == [[0], [1], [2]]
    assert balanced_groups([5, 5, 5, 5], parts=1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="parts"):
        balanced_groups([1, 2], parts=3)


# -------------------------------------------------------------------------------------------- packed attention


def _tiny(family: str, attention: str, dtype=torch.float32):
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, num_key_value_heads=2))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, num_key_value_heads=1))
    elif family == "mistral":  # a sliding window shorter than the longest sequence
        model = MistralForCausalLM(MistralConfig(**common, num_key_value_heads=2, sliding_window=4))
    elif family == "gemma2":  # soft-capped attention scores (eager)
        model = Gemma2ForCausalLM(
            Gemma2Config(**common, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=5.0, sliding_window=4)
        )
    else:
        raise ValueError(family)
    model.set_attn_implementation(attention)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model.to(dtype)


def _ragged_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    rows, prompt, completion = 5, 6, 9
    ids = torch.randint(1, 64, (rows, prompt + completion), generator=generator)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    completion_mask = torch.ones(rows, completion, dtype=torch.long)
    for row, (prompt_length, completion_length) in enumerate([(6, 9), (2, 3), (4, 9), (1, 1), (5, 0)]):
        prompt_mask[row, : prompt - prompt_length] = 0
        completion_mask[row, completion_length:] = 0
    return ids, torch.cat([prompt_mask, completion_mask], dim=1), completion_mask, completion


def _padded_forward(model, ids, mask, completion):
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    labels[:, :-completion] = IGNORE_INDEX
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -completion:], out.entropy[:, -completion:]


def _packed_forward(model, ids, mask, completion):
    packed = pack_rows(ids, mask, completion)
    with varlen_attention.packed_forward():
        out = model(**packed.model_inputs(), shift_labels=packed.shift_labels, fused_lm_head=True)
    return packed.unpack(out.log_probs), packed.unpack(out.entropy)


@pytest.mark.parametrize(
    "family,attention",
    [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa"), ("mistral", "sdpa"), ("gemma2", "eager")],
)
def test_packed_forward_equals_the_padded_one(family, attention):
    """Log-probs, entropies and the gradient of every parameter, float32, at most 1e-5 apart (sliding windows and
    soft-capping included)."""
    torch.manual_seed(0)
    model = _tiny(family, attention)
    ids, mask, completion_mask, completion = _ragged_batch()
    logps, entropy = _padded_forward(model, ids, mask, completion)
    (logps * completion_mask).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    varlen_attention.install(model)
    assert model.config._attn_implementation == f"trl_reasoning_packed_{attention}"
    packed_logps, packed_entropy = _packed_forward(model, ids, mask, completion)
    (packed_logps * completion_mask).sum().backward()
    assert (packed_logps - logps).mul(completion_mask).abs().max() < 1e-5
    assert (packed_entropy - entropy).mul(completion_mask).abs().max() < 1e-5
    assert (packed_logps * (1 - completion_mask)).abs().max() == 0  # zero where TRL's are zero
    for name, param in model.named_parameters():
        assert (param.grad - expected[name]).abs().max() < 1e-5, name
    # An unpacked forward (generation, TRL's padded path) runs the base implementation unchanged.
    again, _ = _padded_forward(model, ids, mask, completion)
    assert torch.equal(again, logps)
    varlen_attention.uninstall(model)
    assert model.config._attn_implementation == attention


def test_packed_forward_in_bfloat16_matches_at_bfloat16_precision():
    torch.manual_seed(0)
    model = _tiny("qwen2", "sdpa", torch.bfloat16)
    ids, mask, completion_mask, completion = _ragged_batch()
    logps, _ = _padded_forward(model, ids, mask, completion)
    varlen_attention.install(model)
    packed_logps, _ = _packed_forward(model, ids, mask, completion)
    # bfloat16 keeps 8 bits: the two orders of summation agree to a few of its units
    assert (packed_logps.float() - logps.float()).mul(completion_mask).abs().max() < 0.1


def test_gradient_checkpointing_recomputes_the_packed_attention():
    torch.manual_seed(0)
    model = _tiny("qwen2", "sdpa")
    ids, mask, completion_mask, completion = _ragged_batch()
    varlen_attention.install(model)
    logps, _ = _packed_forward(model, ids, mask, completion)
    (logps * completion_mask).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model.train()
    logps, _ = _packed_forward(model, ids, mask, completion)
    (logps * completion_mask).sum().backward()
    for name, param in model.named_parameters():
        assert (param.grad - expected[name]).abs().max() < 1e-6, name


def test_generation_is_unchanged_by_the_packed_implementation():
    torch.manual_seed(0)
    model = _tiny("qwen2", "sdpa").eval()
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    before = model.generate(input_ids=prompt, attention_mask=attention_mask, max_new_tokens=6, do_sample=False)
    varlen_attention.install(model)
    after = model.generate(input_ids=prompt, attention_mask=attention_mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(before, after)


def test_attention_sinks_are_refused():
    query = torch.zeros(1, 2, 3, 4)
    module = torch.nn.Module()
    with pytest.raises(varlen_attention.PackedAttentionUnsupported, match="s_aux"):
        varlen_attention.packed_attention(
            module, query, query, query, cu_seq_lens_q=torch.tensor([0, 3]), max_length_q=3, s_aux=torch.zeros(2)
        )


def test_an_attention_implementation_it_cannot_wrap_is_named():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    model.config._attn_implementation_internal = "flex_attention"
    assert "flex_attention" in varlen_attention.unsupported_reason(model)
    with pytest.raises(varlen_attention.PackedAttentionUnsupported, match="flex_attention"):
        varlen_attention.install(model)
