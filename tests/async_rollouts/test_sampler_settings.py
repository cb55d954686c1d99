"""The sampler and the policy see the same processors, or the run is refused before it starts.

Where the sampler's log-probabilities ``mu`` meet the policy's in a ratio, every change ``generate`` (or vLLM) makes to
the logits before sampling must also be made when the policy is scored, or ``pi / mu`` leaves 1 on a fresh batch
(``repetition_penalty=1.3`` moved it to 1.28, ``typical_p=0.5`` starved the run). The trainer repeats the temperature
and the truncation; every other processor is refused where asynchronous rollouts were asked for, and turns
``async_rollouts=None`` (ScaleRL's default) synchronous with a warning.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from conftest import cpu_args, digit_fraction, logged_metric, make_prompts
from transformers import AutoModelForCausalLM, LogitsProcessor

import trl_reasoning as tr
from trl_reasoning.algorithms.sampling_processors import (
    GENERATE_SETTINGS,
    VLLM_SETTINGS,
    model_generation_defaults,
    overridden_settings,
    unreproduced_settings,
)

#: A value of each generate setting that changes the distribution sampled from.
ACTIVE = {
    "repetition_penalty": 1.3,
    "encoder_repetition_penalty": 1.2,
    "no_repeat_ngram_size": 2,
    "encoder_no_repeat_ngram_size": 2,
    "bad_words_ids": [[5]],
    "sequence_bias": {(5,): -1.0},
    "suppress_tokens": [5],
    "begin_suppress_tokens": [5],
    "typical_p": 0.5,
    "epsilon_cutoff": 3e-4,
    "eta_cutoff": 3e-4,
    "min_length": 3,
    "min_new_tokens": 3,
    "forced_bos_token_id": 5,
    "forced_eos_token_id": 2,
    "exponential_decay_length_penalty": (2, 1.1),
    "guidance_scale": 1.5,
    "watermarking_config": {"greenlist_ratio": 0.25},
    "logits_processor": ["a processor"],
    "num_beams": 2,
    "num_return_sequences": 2,
    "do_sample": False,
}


def test_every_generate_setting_is_named_when_active_and_silent_when_neutral():
    assert set(ACTIVE) == set(GENERATE_SETTINGS)
    for name, value in ACTIVE.items():
        (found,) = unreproduced_settings({name: value})
        assert found.startswith(f"{name}={value!r} ("), found
    neutral = {
        "repetition_penalty": 1.0,
        "typical_p": 1.0,
        "epsilon_cutoff": 0.0,
        "suppress_tokens": [],
        "no_repeat_ngram_size": 0,
        "bad_words_ids": None,
        "num_beams": 1,
        "do_sample": True,
        "temperature": 0.7,  # repeated by the trainer
        "top_k": 5,
        "top_p": 0.9,
        "min_p": 0.1,
    }
    assert unreproduced_settings(neutral) == []
    assert unreproduced_settings({"presence_penalty": 0.5, "repetition_penalty": 1.0}, "vllm") == [
        f"presence_penalty=0.5 ({VLLM_SETTINGS['presence_penalty'][1]})"
    ]


@pytest.mark.parametrize(
    "generation_kwargs,named",
    [
        ({"temperature": 0.5}, "generation_kwargs['temperature']=0.5"),
        ({"top_k": None}, "generation_kwargs['top_k']=None"),
        ({"temperature": None}, "generation_kwargs['temperature']=None"),
        ({"min_p": None, "top_p": 0.9}, "generation_kwargs['min_p']=None"),
    ],
)
def test_a_repeated_setting_overridden_in_generation_kwargs_is_checked_by_value(generation_kwargs, named):
    """The temperature and truncation the trainer repeats, changed in generation_kwargs: refused by key and value
    where the sampler's log-probs meet the policy's; the same value as the config's, or a truncation by value, is
    repeated and passes; the synchronous run TRL trains is accepted."""
    assert overridden_settings(1.0, generation_kwargs)[0].startswith(named)
    with pytest.raises(ValueError, match=rf"async_rollouts=True.*{re.escape(named)}"):
        tr.ReasoningConfig(**cpu_args(async_rollouts=True, generation_kwargs=generation_kwargs))
    tr.ReasoningConfig(**cpu_args(async_rollouts=False, generation_kwargs=generation_kwargs))
    assert overridden_settings(0.7, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}) == []


def test_scalerl_turns_synchronous_with_an_overridden_temperature(tiny_model_path, tmp_path):
    args = tr.ScaleRLConfig(**cpu_args(output_dir=str(tmp_path), generation_kwargs={"temperature": 0.5}))
    with pytest.warns(UserWarning, match=r"synchronously.*generation_kwargs\['temperature'\]=0.5"):
        trainer = tr.ScaleRLTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
    assert trainer.async_rollouts is None


def test_the_model_s_generation_config_fills_only_what_the_trainer_leaves_unset():
    trainer_settings = {"top_k": 0, "min_p": None, "repetition_penalty": 1.0, "typical_p": None}
    model_settings = {"top_k": 50, "min_p": 0.05, "repetition_penalty": 1.2, "typical_p": 0.9, "max_length": 20}
    assert model_generation_defaults(trainer_settings, model_settings) == {"min_p": 0.05, "typical_p": 0.9}


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_asynchronous_rollouts_refuse_each_setting_at_construction_naming_it(name):
    settings = {"repetition_penalty": ACTIVE[name]} if name == "repetition_penalty" else {}
    kwargs = {} if name == "repetition_penalty" else {name: ACTIVE[name]}
    with pytest.raises(ValueError, match=rf"async_rollouts=True.*{name}=.*async_rollouts=False"):
        tr.ReasoningConfig(**cpu_args(async_rollouts=True, generation_kwargs=kwargs or None, **settings))
    # the synchronous run that TRL trains is accepted
    tr.ReasoningConfig(**cpu_args(async_rollouts=False, generation_kwargs=kwargs or None, **settings))


def test_scalerl_trains_synchronously_with_a_setting_it_cannot_repeat_and_says_why(tiny_model_path, tmp_path):
    args = tr.ScaleRLConfig(**cpu_args(output_dir=str(tmp_path), repetition_penalty=1.3, max_steps=2))
    assert args.async_rollouts is None
    with pytest.warns(UserWarning, match=r"async_rollouts=None.*synchronously.*repetition_penalty=1.3"):
        trainer = tr.ScaleRLTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
    assert trainer.async_rollouts is None and trainer.args.ratio_anchor == "pi_old"
    trainer.train()
    assert all(math.isfinite(loss) for loss in logged_metric(trainer, "loss"))


@pytest.mark.parametrize(("name", "value"), [("typical_p", 0.5), ("min_p", 0.05), ("no_repeat_ngram_size", 2)])
def test_a_setting_from_the_model_s_own_generation_config_is_refused_or_turns_async_off(
    name, value, tiny_model_path, tmp_path
):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    setattr(model.generation_config, name, value)
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), async_rollouts=True))
    with pytest.raises(
        ValueError, match=rf"async_rollouts=True: {name}={value!r}.*from the model's generation_config"
    ):
        tr.ReasoningTrainer(model=model, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())
    # its way out: the neutral value in generation_kwargs (min_p: set it in the config, and it is repeated)
    neutral = {"typical_p": 1.0, "min_p": 0.0, "no_repeat_ngram_size": 0}[name]
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), async_rollouts=True, generation_kwargs={name: neutral})
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tr.ReasoningTrainer(model=model, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())


class _Ban(LogitsProcessor):
    def __call__(self, input_ids, scores):
        scores[:, 5] = -math.inf
        return scores


def test_a_processor_that_reaches_generate_another_way_stops_the_run_naming_it(tiny_model_path, tmp_path):
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), async_rollouts=True, max_steps=1))
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    build = trainer.model._get_logits_processor

    def with_ban(*a, **k):
        processors = build(*a, **k)
        processors.append(_Ban())
        return processors

    trainer.model._get_logits_processor = with_ban
    with pytest.raises(ValueError, match=r"generate applies _Ban.*async_rollouts=False"):
        trainer.train()


def test_at_lag_0_the_repeated_processors_give_a_ratio_of_one(tiny_model_path, tmp_path):
    args = tr.ReasoningConfig(
        **cpu_args(
            output_dir=str(tmp_path),
            async_rollouts=True,
            max_staleness=0,
            max_steps=2,
            temperature=0.7,
            top_k=6,
            top_p=0.9,
            min_p=0.05,
        )
    )
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
    )
    trainer.train()
    ratio = torch.tensor(logged_metric(trainer, "async/sampler_ratio/mean"))
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-4, rtol=0)


def test_the_logged_entropy_keeps_trl_s_meaning_under_truncated_support_scoring(tiny_model_path, tmp_path):
    """The policy scored on the sampler's truncated support (asynchronous, top_p < 1) logs the entropy of its whole
    distribution, as the synchronous run and GRPOTrainer do: switching sync -> async must not change the curve 3x."""
    entropies = {}
    for name, settings in {
        "sync": dict(async_rollouts=False),
        "k0": dict(async_rollouts=True, max_staleness=0),
    }.items():
        torch.manual_seed(0)
        args = tr.ReasoningConfig(
            **cpu_args(output_dir=str(tmp_path / name), max_steps=1, top_p=0.8, top_k=5, **settings)
        )
        trainer = tr.ReasoningTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
        assert trainer.args.truncated_support_scoring is (name == "k0")
        trainer.train()
        entropies[name] = logged_metric(trainer, "entropy")
    torch.testing.assert_close(torch.tensor(entropies["k0"]), torch.tensor(entropies["sync"]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("generation_kwargs", [{"num_beams": 2}, {"num_beams": 2, "num_return_sequences": 1}])
def test_beam_search_trains_on_scalerl_s_defaults_as_trl_trains_it(generation_kwargs, tiny_model_path, tmp_path):
    """TRL's ``test_train_with_generation_kwargs`` on ScaleRL (asynchronous by default): beam search keeps the likeliest
    sequences instead of sampling them, so there is no sampler distribution to weigh by; ScaleRL's ``None`` trains it
    synchronously, as GRPOTrainer does, and says why; ``async_rollouts=True`` is refused naming ``num_beams``."""
    settings = cpu_args(output_dir=str(tmp_path), generation_kwargs=generation_kwargs, max_steps=2)
    with pytest.raises(ValueError, match=r"num_beams=2 \(beam search.*async_rollouts=False"):
        tr.ScaleRLConfig(**{**settings, "async_rollouts": True})
    args = tr.ScaleRLConfig(**settings)
    with pytest.warns(UserWarning, match=r"async_rollouts=None.*synchronously.*num_beams=2"):
        trainer = tr.ScaleRLTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
        )
    trainer.train()
    assert trainer.async_rollouts is None
    assert all(math.isfinite(loss) for loss in logged_metric(trainer, "loss"))
