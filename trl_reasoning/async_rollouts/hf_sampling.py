"""Sampling with HF ``generate`` outside TRL's ``_generate``, as TRL's ``_generate_single_turn`` samples: how the
trainer samples (:class:`SamplingSettings`, read from it by :func:`sampling_settings`), a batch sampled with the
sampled tokens' log-probabilities read from ``generate``'s own scores (:func:`sample`), and a scored batch laid out as
TRL lays it out (:func:`padded_batch`). Used by the in-process generator, the worker process and the trainer's forward
of a batch whose scores were not recorded."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .protocols import AsyncRolloutHost
from .sampler_logps import completion_logps, sampled_logps_recorded


@dataclasses.dataclass
class SamplingSettings:
    """What the worker needs to sample and score as the trainer would."""

    generation_config: Any
    pad_token_id: int
    eos_token_ids: list[int]
    temperature: float
    pad_to_multiple_of: int | None
    batch_size: int
    threads: int = 1
    device: str = "cpu"  # where the worker's copy of the model samples (the trainer's device)


def sampling_settings(host: AsyncRolloutHost) -> SamplingSettings:
    """How the trainer ``host`` samples, for a generator outside TRL's ``_generate``."""
    return SamplingSettings(
        generation_config=host.generation_config,
        pad_token_id=host._tokenizer.pad_token_id,
        eos_token_ids=list(host.eos_token_ids),
        temperature=host.temperature,
        pad_to_multiple_of=host.pad_to_multiple_of,
        batch_size=host.args.per_device_train_batch_size,
        device=str(host.accelerator.device),
    )


def _padded(rows: list[list[int]], value: int, side: str, multiple: int | None) -> torch.Tensor:
    from trl.trainer.utils import pad

    return pad([torch.tensor(row, dtype=torch.long) for row in rows], value, side, multiple)


@torch.no_grad()
def sample(
    model: torch.nn.Module, prompt_ids: list[list[int]], settings: SamplingSettings
) -> tuple[list[list[int]], list[list[float]]]:
    """``generate`` as TRL's ``_generate_single_turn`` calls it; each completion ends at its first EOS. Returns the
    completions and their tokens' log-probabilities under the distribution ``generate`` sampled them from, read from
    its scores (``trl_reasoning.async_rollouts.sampler_logps``: the truncated, renormalised one when sampling truncates)."""
    input_ids = _padded(prompt_ids, settings.pad_token_id, "left", settings.pad_to_multiple_of).to(settings.device)
    attention_mask = _padded([[1] * len(ids) for ids in prompt_ids], 0, "left", settings.pad_to_multiple_of)
    attention_mask = attention_mask.to(settings.device)
    with sampled_logps_recorded(model) as records:
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=settings.generation_config
        )
    completions = []
    for row in output[:, input_ids.size(1) :].tolist():
        ends = [i for i, token in enumerate(row) if token in settings.eos_token_ids]
        completions.append(row[: ends[0] + 1] if ends else row)
    logps = completion_logps(records, completions)
    if logps is None:
        raise RuntimeError(
            "generate's scores were not recorded: this transformers no longer builds its logits "
            "processors with _get_logits_processor"
        )
    return completions, logps


def padded_batch(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_token_id: int, multiple: int | None
) -> dict[str, torch.Tensor]:
    """Prompts left-padded and completions right-padded, with their masks, as TRL lays out a scored batch."""
    return {
        "prompt_ids": _padded(prompt_ids, pad_token_id, "left", multiple),
        "prompt_mask": _padded([[1] * len(ids) for ids in prompt_ids], 0, "left", multiple),
        "completion_ids": _padded(completion_ids, pad_token_id, "right", multiple),
        "completion_mask": _padded([[1] * len(ids) for ids in completion_ids], 0, "right", multiple),
    }
