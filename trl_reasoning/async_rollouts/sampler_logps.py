"""The sampler's own log-probabilities of the tokens HF ``generate`` sampled, read from the scores it sampled from.

At every step ``generate`` turns the model's logits into the scores it samples from by its list of logits processors
(repetition penalty, suppressed tokens, ..., then the temperature, top-k, top-p, min-p warpers) and draws the next
token from ``softmax(scores)``. ``log_softmax(scores)`` at the sampled token is therefore the behaviour policy's
log-probability ``mu`` of that token, the truncated and renormalised one when sampling truncates (what vLLM returns
with ``--logprobs-mode processed_logprobs``; see ``trl_reasoning.algorithms.truncation``). Reading it there replaces a second,
no-grad forward over the whole batch.

The processors ``generate`` builds are applied in its own order, the warpers last, after any processor passed to it:
so a processor passed to ``generate`` would see the scores before the temperature and the truncation. Instead
:func:`sampled_logps_recorded` appends :class:`SampledTokenLogps` to the end of the list ``generate`` builds (an
instance-level wrap of the model's ``_get_logits_processor``, undone on exit). A processor sees the scores of step
``t`` but not the token drawn from them; it sees that token as the last input id at step ``t + 1``. So it keeps the
scores of one step (a reference to a tensor ``generate`` built anyway, and their ``logsumexp`` ``[B]``), reads the
previous step's sampled token's entry when called again, and the last step's from the returned sequences: one
``[B]`` vector a step is all it stores (``output_scores`` would keep every step's ``[B, V]`` scores).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import LogitsProcessor
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class SampledTokenLogps(LogitsProcessor):
    """Records ``log_softmax(scores)`` at each sampled token of one ``generate`` call (last in its processor list)."""

    def __init__(self):
        self._scores: torch.Tensor | None = None
        self._logsumexp: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._scores is not None:
            self._take(input_ids[:, -1])
        self._scores = scores
        self._logsumexp = torch.logsumexp(scores.float(), dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        sampled = self._scores.gather(-1, tokens.unsqueeze(-1).to(self._scores.device)).squeeze(-1)
        self._steps.append(sampled.float() - self._logsumexp)
        self._scores = self._logsumexp = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor | None:
        """The ``[B, steps]`` log-probs of the tokens sampled, given the sequences ``generate`` returned (the last
        step's token is their last column); ``None`` when no step was seen (this processor was not called)."""
        if self._scores is None and not self._steps:
            return None
        if self._scores is not None:
            self._take(sequences[:, -1])
        return torch.stack(self._steps, dim=1)


#: The processors whose effect the trainer repeats when it scores the policy (the temperature and the truncation,
#: ``trl_reasoning.algorithms.truncation``); the configuration refuses the others before a run starts
#: (``trl_reasoning.algorithms.sampling_processors``), and this list catches any that reach ``generate`` another way.
REPRODUCED_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)


def check_reproduced(processors) -> None:
    """Raise a ``ValueError`` naming each processor in ``processors`` whose change to the distribution the trainer
    would not repeat when it scores the policy (the recorded ``mu`` would then not be the ``mu`` it compares with)."""
    foreign = sorted({type(p).__name__ for p in processors if not isinstance(p, REPRODUCED_PROCESSORS)})
    if foreign:
        raise ValueError(
            f"generate applies {', '.join(foreign)}, which changes the distribution the asynchronous sampler draws "
            "from in a way the trainer does not repeat when it scores the policy (the importance ratio pi / mu would "
            "not be 1 on a fresh batch). Remove the setting or processor that adds it (from generation_kwargs, the "
            "config, or the model's generation_config), or set async_rollouts=False."
        )


def _generation_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose ``generate`` builds the processors (a PEFT model's base model)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def sampled_logps_recorded(model: torch.nn.Module) -> Iterator[list[torch.Tensor | None]]:
    """Within the block, every ``generate`` call of ``model`` records the sampled tokens' log-probabilities under the
    distribution it sampled from; yields the list that receives one ``[B, new tokens]`` tensor per call (``None`` for
    a call whose processors were not built by ``_get_logits_processor``). ``model`` is as it was afterwards."""
    target = _generation_model(model)
    own = {name: vars(target)[name] for name in ("generate", "_get_logits_processor") if name in vars(target)}
    generate, build_processors = target.generate, target._get_logits_processor
    records: list[torch.Tensor | None] = []
    current: list[SampledTokenLogps] = []

    def processors_with_recorder(*args, **kwargs):
        processors = build_processors(*args, **kwargs)
        if current:
            check_reproduced(processors)
            processors.append(current[-1])
        return processors

    def generate_recording(*args, **kwargs):
        current.append(SampledTokenLogps())
        try:
            output = generate(*args, **kwargs)
        finally:
            recorder = current.pop()
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        records.append(recorder.finish(sequences))
        return output

    target.generate = generate_recording
    target._get_logits_processor = processors_with_recorder
    try:
        yield records
    finally:
        for name in ("generate", "_get_logits_processor"):
            if name in own:
                setattr(target, name, own[name])
            else:
                delattr(target, name)


def completion_logps(records: list[torch.Tensor | None], completion_ids: list[list[int]]) -> list[list[float]] | None:
    """Each completion's sampled-token log-probs from the one ``generate`` call recorded (rows in the order it
    sampled them, each completion a prefix of its row: ``generate`` pads a row after its EOS); ``None`` when not
    exactly one call was recorded, or it does not cover the completions (the caller then scores them by a forward)."""
    if len(records) != 1 or records[0] is None:
        return None
    logps = records[0]
    if logps.size(0) != len(completion_ids) or any(len(ids) > logps.size(1) for ids in completion_ids):
        return None
    return [row[: len(ids)].tolist() for row, ids in zip(logps.cpu(), completion_ids, strict=True)]
