"""What a generator that samples ahead (``async_generator="process"`` or ``"server"``) cannot honour of TRL's trainer
inputs is refused at construction with the way out; ``"inline"`` honours it (TRL's own ``_generate`` runs).

Honoured elsewhere: TRL's sampling settings (``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``,
``generation_kwargs``) by the worker (``test_the_generator_process_samples_the_batches_of_the_inline_one``) and by the
server (``server_generator.sampling_parameters``, checked against TRL's ``VLLMGeneration.generate`` in
``tests/trainer/test_trl_compat.py``).
"""

from __future__ import annotations

import pytest
import trl.trainer.grpo_trainer as trl_grpo
from conftest import cpu_args, digit_fraction, make_prompts
from test_async_server import ServerModeGeneration

import trl_reasoning as tr


def _trainer(model_path, tmp_path, rollout_func=None, **overrides):
    settings = dict(async_rollouts=True, max_staleness=1, max_steps=1)
    settings.update(overrides)
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), **settings))
    return tr.ReasoningTrainer(
        model=model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(16),
        rollout_func=rollout_func,
    )


class FixedRollouts:
    """A user's ``rollout_func``: three fixed tokens per completion, counted."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, trainer):
        self.calls += 1
        prompt_ids = trainer.tokenize_prompts(prompts)
        eos = trainer.processing_class.eos_token_id
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [[5, 6, eos] for _ in prompt_ids],
            "logprobs": [[-1.0, -1.0, -1.0] for _ in prompt_ids],
        }


@pytest.mark.parametrize("generator", ["process", "server"])
def test_a_rollout_func_is_refused_by_a_generator_that_samples_ahead(
    generator, monkeypatch, tiny_model_path, tmp_path
):
    vllm = dict(use_vllm=True, vllm_mode="server") if generator == "server" else {}
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", ServerModeGeneration)
    with pytest.raises(
        ValueError, match=rf"async_generator='{generator}' does not support a rollout_func .*async_generator='inline'"
    ):
        _trainer(tiny_model_path, tmp_path, rollout_func=FixedRollouts(), async_generator=generator, **vllm)


def test_a_rollout_func_is_called_by_the_inline_generator(tiny_model_path, tmp_path):
    rollouts = FixedRollouts()
    trainer = _trainer(tiny_model_path, tmp_path, rollout_func=rollouts, async_generator="inline")
    trainer.train()
    assert rollouts.calls == 1


def test_continuous_batching_is_refused_by_the_generator_process(tiny_model_path, tmp_path):
    for flag in ("use_transformers_continuous_batching", "use_transformers_paged"):
        with pytest.raises(
            ValueError, match=r"async_generator='process' does not support use_transformers_continuous"
        ):
            _trainer(tiny_model_path, tmp_path, async_generator="process", **{flag: True})
