"""Which generation settings change the sampler's distribution ``mu`` in a way the policy's scoring does not repeat.

Where the sampler's log-probabilities enter the loss (asynchronous rollouts, vLLM with its correction or a ratio taken
against the sampler), ``pi / mu`` must be 1 on an on-policy token, so every change ``generate`` or vLLM makes to the
logits before sampling must also be made to ``pi``. The trainer repeats the temperature and the truncation (top-k,
top-p, min-p: ``trl_reasoning.algorithms.truncation``). Every other processor (a repetition penalty, typical or
epsilon sampling, banned or suppressed tokens, a user's processor, ...) would make the ratio drift from 1 with no
off-policyness at all: with ``repetition_penalty=1.3`` it reaches 1.28 on a fresh batch, with ``typical_p=0.5`` the
correction weights average 3e-4 and the run learns nothing. :func:`unreproduced_settings` names them, so the trainer
refuses them (or, where asynchronous rollouts were only asked for "where supported", trains synchronously).

Pure functions over plain mappings: no TRL, no transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _is_one(value: Any) -> bool:
    return value is None or float(value) == 1.0


def _is_zero(value: Any) -> bool:
    return value is None or float(value) == 0.0


def _is_empty(value: Any) -> bool:
    return value is None or (hasattr(value, "__len__") and len(value) == 0)


def _is_none(value: Any) -> bool:
    return value is None


def _at_most_one(value: Any) -> bool:
    return value is None or int(value) <= 1


def _samples(value: Any) -> bool:
    return value is None or bool(value)


#: ``generate``'s settings (``GenerationConfig`` fields, or ``generation_kwargs`` keys) whose processor changes the
#: distribution sampled from: the setting, the test that it is off, and what it does.
GENERATE_SETTINGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "repetition_penalty": (_is_one, "rescales the logits of tokens already in the sequence"),
    "encoder_repetition_penalty": (_is_one, "rescales the logits of tokens in the prompt"),
    "no_repeat_ngram_size": (_is_zero, "bans tokens that would repeat an n-gram"),
    "encoder_no_repeat_ngram_size": (_is_zero, "bans tokens that would repeat an n-gram of the prompt"),
    "bad_words_ids": (_is_empty, "bans token sequences"),
    "sequence_bias": (_is_empty, "adds biases to token sequences"),
    "suppress_tokens": (_is_empty, "bans tokens"),
    "begin_suppress_tokens": (_is_empty, "bans tokens at the first position"),
    "typical_p": (_is_one, "truncates to the locally typical tokens"),
    "epsilon_cutoff": (_is_zero, "truncates tokens below a probability"),
    "eta_cutoff": (_is_zero, "truncates tokens below an entropy-dependent probability"),
    "min_length": (_is_zero, "bans the end of sequence before a length"),
    "min_new_tokens": (_is_zero, "bans the end of sequence before a length"),
    "forced_bos_token_id": (_is_none, "forces a first token"),
    "forced_eos_token_id": (_is_none, "forces the end of sequence at the length limit"),
    "exponential_decay_length_penalty": (_is_none, "raises the end of sequence's logit with the length"),
    "guidance_scale": (_is_one, "mixes in an unconditional model's logits"),
    "watermarking_config": (_is_none, "biases a pseudo-random subset of tokens"),
    "logits_processor": (_is_empty, "a processor of your own"),
    "num_beams": (_at_most_one, "beam search keeps the likeliest sequences instead of sampling them"),
    "num_return_sequences": (_at_most_one, "returns several sequences per prompt row"),
    "do_sample": (_samples, "greedy decoding does not sample"),
}
#: vLLM's ``SamplingParams`` (TRL passes ``repetition_penalty`` and ``generation_kwargs`` to it) likewise.
VLLM_SETTINGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "repetition_penalty": (_is_one, "rescales the logits of tokens already in the sequence"),
    "presence_penalty": (_is_zero, "lowers the logits of tokens already in the sequence"),
    "frequency_penalty": (_is_zero, "lowers the logits of tokens by their count in the sequence"),
    "logit_bias": (_is_empty, "adds biases to tokens"),
    "bad_words": (_is_empty, "bans words"),
    "allowed_token_ids": (_is_empty, "restricts the vocabulary"),
    "min_tokens": (_is_zero, "bans the end of sequence before a length"),
    "logits_processors": (_is_empty, "processors of your own"),
    "structured_outputs": (_is_none, "restricts tokens to a grammar"),
    "n": (_at_most_one, "returns several sequences per prompt"),
}


def unreproduced_settings(settings: Mapping[str, Any], engine: str = "generate") -> list[str]:
    """``"field=value (what it does)"`` for each setting in ``settings`` that changes the sampler's distribution in
    a way the trainer does not repeat when it scores the policy, for ``engine`` ``"generate"`` or ``"vllm"``."""
    table = VLLM_SETTINGS if engine == "vllm" else GENERATE_SETTINGS
    found = []
    for name, value in settings.items():
        if name in table and not table[name][0](value):
            found.append(f"{name}={value!r} ({table[name][1]})")
    return found


def model_generation_defaults(trainer_settings: Mapping[str, Any], model_settings: Mapping[str, Any]) -> dict:
    """The settings ``generate`` takes from the model's own ``generation_config``: those the trainer's generation
    config leaves ``None`` (transformers fills exactly those), restricted to the ones that matter here (the
    processors of :data:`GENERATE_SETTINGS` and ``min_p``, which the trainer must know to score on the same
    support)."""
    watched = set(GENERATE_SETTINGS) | {"min_p"}
    return {
        name: value
        for name, value in model_settings.items()
        if name in watched and value is not None and trainer_settings.get(name) is None
    }


#: The sampling settings the trainer repeats when it scores the policy, read from the config (``temperature``,
#: ``top_k``, ``top_p``, ``min_p``). ``generation_kwargs`` reaches ``generate`` and vLLM after TRL's own values.
REPEATED_SETTINGS = ("temperature", "top_k", "top_p", "min_p")


def overridden_settings(temperature: float, generation_kwargs: Mapping[str, Any] | None) -> list[str]:
    """``"key=value (why)"`` for each ``generation_kwargs`` entry that changes a setting the trainer repeats in a
    way its scoring does not follow, by value: a ``temperature`` other than the config's (the sampler would draw at
    one temperature while ``pi`` is scored at the other; at lag 0 the ratio's minimum fell to 0.08), and ``None`` for
    any of :data:`REPEATED_SETTINGS` (``generate`` then fills transformers' own default, ``top_k=50``, while ``pi`` is
    scored untruncated: a ratio mean of 0.58 at lag 0). A truncation given there by value is repeated (the
    truncated-support scoring reads it), so it is not listed."""
    found = []
    for key, value in (generation_kwargs or {}).items():
        if key not in REPEATED_SETTINGS:
            continue
        if value is None:
            found.append(
                f"generation_kwargs[{key!r}]=None (the sampler then takes the engine's own default, which the trainer "
                f"does not know; set {key} in the config instead)"
            )
        elif key == "temperature" and float(value) != float(temperature):
            found.append(
                f"generation_kwargs['temperature']={value!r} (the sampler draws at it while the policy is scored at "
                f"temperature={temperature!r}; set temperature in the config instead)"
            )
    return found
