"""The FP32 LM head of MiniMax-M1 (arXiv 2506.13585, §3.2) and ScaleRL (arXiv 2510.13786, §3), on any causal LM.

Knows models and torch, not TRL. TRL's `cast_lm_head_to_fp32` reaches the input embeddings as
`model.model.embed_tokens`, which a PEFT-wrapped model does not have (`PeftModel.model` is the causal LM, whose
backbone holds `embed_tokens`), so TRL 1.16 fails at construction for LoRA/QLoRA on a model with tied embeddings
(Qwen2.5-0.5B/1.5B, Llama-3.2-1B/3B). [`cast_lm_head_to_fp32`] does the same cast through
`get_output_embeddings()` / `get_input_embeddings()`, which every architecture and PEFT wrapper provides.
"""

from __future__ import annotations

import torch
from torch import nn


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (`model` itself when it is not one)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) and hasattr(model, "peft_config") else model


def lm_head_has_adapter(model: nn.Module) -> bool:
    """Whether the LM head carries a PEFT adapter (then it must stay as PEFT built it)."""
    head = unwrap_peft(model).get_output_embeddings()
    return hasattr(head, "base_layer") or hasattr(head, "lora_A")


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """Run the LM head in float32: its weight (and bias) become float32 and its forward casts the hidden states up, so
    the logits are float32 whatever the backbone's dtype. With tied embeddings the shared weight is float32 too, and
    the input embeddings' output is cast back to the dtype the head had, so the backbone keeps its own dtype.

    Same effect as TRL's `cast_lm_head_to_fp32` (a no-op on a float32 model); `model` may be wrapped by PEFT.

    Raises:
        ValueError: the LM head carries a PEFT adapter (an adapter's own dtype handling would be bypassed).
    """
    base = unwrap_peft(model)
    head = base.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ValueError(f"cast_lm_head_to_fp32: {type(base).__name__} has no LM head with a weight to cast.")
    if lm_head_has_adapter(model):
        raise ValueError(
            "`cast_lm_head_to_fp32=True` is not supported when the lm_head carries a PEFT adapter (e.g. "
            "`target_modules` includes `lm_head`). Remove `lm_head` from the adapter's target modules, or set "
            "`cast_lm_head_to_fp32=False`."
        )
    original_dtype = head.weight.dtype
    head.float()  # in place: a weight shared with the input embeddings stays shared

    def fp32_forward(hidden_states: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(
            hidden_states.float(), head.weight.float(), None if head.bias is None else head.bias.float()
        )

    head.forward = fp32_forward
    embeddings = base.get_input_embeddings()
    if (
        embeddings is not None
        and getattr(embeddings, "weight", None) is head.weight
        and original_dtype != torch.float32
    ):

        def keep_embedding_dtype(module, inputs, output):
            return output.to(original_dtype)

        embeddings.register_forward_hook(keep_embedding_dtype)
