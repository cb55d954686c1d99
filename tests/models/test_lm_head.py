"""The FP32 LM head (MiniMax-M1, ScaleRL) under PEFT, where TRL 1.16's own cast fails on tied embeddings."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_args, has_digit, make_prompts
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

import trl_reasoning as tr
from trl_reasoning.models.lm_head import cast_lm_head_to_fp32

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def test_trl_cast_fails_under_peft_with_tied_embeddings(tiny_model_path, tmp_path):
    # The failure this module works around; when TRL fixes it, this test tells us the workaround can go.
    args = GRPOConfig(**cpu_args(output_dir=str(tmp_path)), cast_lm_head_to_fp32=True)
    with pytest.raises(AttributeError, match="embed_tokens"):
        GRPOTrainer(
            model=tiny_model_path,
            reward_funcs=has_digit,
            args=args,
            train_dataset=make_prompts(),
            peft_config=LoraConfig(**LORA),
        )


def test_cast_keeps_the_backbone_dtype_and_makes_fp32_logits(tiny_model_path):
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16), LoraConfig(**LORA)
    )
    base = model.get_base_model()
    assert base.get_input_embeddings().weight is base.get_output_embeddings().weight  # tied
    cast_lm_head_to_fp32(model)
    assert base.get_output_embeddings().weight.dtype == torch.float32
    assert base.get_input_embeddings().weight is base.get_output_embeddings().weight  # still tied
    ids = torch.tensor([[3, 4, 5, 6]])
    assert base.get_input_embeddings()(ids).dtype == torch.bfloat16  # the backbone runs in its own dtype
    assert model(input_ids=ids).logits.dtype == torch.float32


def test_cast_refuses_an_adapter_on_the_lm_head(tiny_untied_model_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_untied_model_path), lora)
    with pytest.raises(ValueError, match="lm_head carries a PEFT adapter"):
        cast_lm_head_to_fp32(model)


def _per_token_logps(trainer, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_ids"].size(1), batch_size=8
        )
    return logps


def test_scalerl_lora_fp32_head_equals_trls_cast_without_peft(tiny_model_path, tmp_path):
    """ScaleRL turns the FP32 head on. Under LoRA (B = 0 at init, so the same function as the base) on a bfloat16
    model with tied embeddings, the trained log-probs equal TRL's own FP32-head path on the model without PEFT."""
    common = cpu_args(output_dir=str(tmp_path), model_init_kwargs={"dtype": torch.bfloat16}, max_steps=2)
    ours = tr.ScaleRLTrainer(
        model=tiny_model_path,
        reward_funcs=has_digit,
        args=tr.ScaleRLConfig(**common),
        train_dataset=make_prompts(),
        peft_config=LoraConfig(**LORA),
    )
    assert ours.args.cast_lm_head_to_fp32 is True  # the preset's setting survives construction
    theirs = GRPOTrainer(
        model=tiny_model_path,
        reward_funcs=has_digit,
        args=GRPOConfig(**common, cast_lm_head_to_fp32=True),
        train_dataset=make_prompts(),
    )
    head = ours.model.get_base_model().get_output_embeddings()
    assert head.weight.dtype == torch.float32
    assert ours.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16

    torch.manual_seed(0)
    prompt_ids = torch.randint(3, 20, (8, 5))
    completion_ids = torch.randint(3, 20, (8, 6))
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
    }
    ours_logps, theirs_logps = _per_token_logps(ours, batch), _per_token_logps(theirs, batch)
    assert ours_logps.dtype == theirs_logps.dtype == torch.float32
    torch.testing.assert_close(ours_logps, theirs_logps, rtol=0, atol=1e-6)

    # and the run goes on: LoRA trains past construction
    lora_before = {n: p.detach().clone() for n, p in ours.model.named_parameters() if "lora_B" in n}
    ours.train()
    assert ours.state.global_step == 2
    assert any(not torch.equal(lora_before[n], p) for n, p in ours.model.named_parameters() if "lora_B" in n)
