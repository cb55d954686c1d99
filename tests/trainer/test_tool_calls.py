"""Tool calls that fail, hang or answer at length: ``trl_reasoning.trainer.tool_calls`` and its place in TRL's loop."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest
import torch
from conftest import cpu_args, logged_metric, make_prompts, scored_batches, tool_calling_model, unpadded_rows

import trl_reasoning as tr
from trl_reasoning.trainer.tool_calls import ToolCallGuard, ToolCallTimeout


def _guarded(guard: ToolCallGuard, **tools) -> dict:
    table = dict(tools)
    guard.guard([table], None)
    return table


class _WordTokenizer:
    """One token per whitespace-separated word: enough to count and cut a response."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}

    def decode(self, ids):
        return " ".join(ids)


def test_a_failing_tool_is_warned_once_by_name_counted_and_still_raises_for_trl():
    def divide(a, b):
        return a / b

    guard = ToolCallGuard(timeout=None, max_response_tokens=None, tokenizer=None)
    table = _guarded(guard, divide=divide)
    with pytest.warns(UserWarning, match=r"Tool 'divide' failed: ZeroDivisionError: division by zero"):
        with pytest.raises(ZeroDivisionError):
            table["divide"](a=1, b=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second failure is counted, not warned again
        with pytest.raises(ZeroDivisionError):
            table["divide"](a=2, b=0)
        assert table["divide"](a=6, b=3) == 2.0
    assert guard.take_failures() == {"divide": 2}
    assert guard.take_failures() == {}  # taken once
    assert guard.failed_names == {"divide"}
    assert table["divide"].__name__ == "divide"  # TRL finds a tool by its name
    guard.guard([table], None)
    assert table["divide"].__wrapped__ is divide  # wrapped once, not again


def test_a_hanging_sync_tool_fails_after_the_timeout_without_holding_up_the_caller():
    def hang():
        time.sleep(30)

    guard = ToolCallGuard(timeout=0.3, max_response_tokens=None, tokenizer=None)
    table = _guarded(guard, hang=hang, quick=lambda: "ok")
    started = time.perf_counter()
    with pytest.warns(UserWarning, match="Tool 'hang' failed: ToolCallTimeout"):
        with pytest.raises(ToolCallTimeout, match=r"tool 'hang' did not answer within 0.3 s \(tool_call_timeout\)"):
            table["hang"]()
    assert time.perf_counter() - started < 5
    assert table["quick"]() == "ok"


def test_a_hanging_async_tool_is_cancelled_after_the_timeout():
    async def hang():
        await asyncio.sleep(30)

    async def answer(x):
        return x + 1

    guard = ToolCallGuard(timeout=0.2, max_response_tokens=None, tokenizer=None)
    table = {"hang": hang, "answer": answer}
    guard.guard(None, [table])
    assert asyncio.run(table["answer"](x=1)) == 2
    with pytest.warns(UserWarning, match="Tool 'hang' failed"):
        with pytest.raises(ToolCallTimeout):
            asyncio.run(table["hang"]())
    assert asyncio.iscoroutinefunction(table["hang"])


def test_a_long_text_response_is_cut_to_the_token_bound_and_others_are_left_alone():
    guard = ToolCallGuard(timeout=None, max_response_tokens=3, tokenizer=_WordTokenizer())
    table = _guarded(
        guard,
        long=lambda: "one two three four five",
        short=lambda: "one two",
        number=lambda: 12345,
        images=lambda: [{"type": "text", "text": "a b c d e"}],
    )
    assert table["long"]() == "one two three [... 2 more tokens of long's response cut]"
    assert table["short"]() == "one two"
    assert table["number"]() == 12345
    assert table["images"]() == [{"type": "text", "text": "a b c d e"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [("tool_call_timeout", 0.0), ("tool_call_timeout", float("inf")), ("max_tool_response_tokens", 0)],
)
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        tr.ReasoningConfig(**cpu_args(**{field: value}))


def _learns(completions, **kwargs) -> list[float]:
    """Rewards that differ within every group, so that each step moves the weights."""
    return [float(i % 2) for i in range(len(completions))]


def _tool_trainer(tmp_path, tool, reward_funcs=_learns, config_kwargs=None, **cpu_overrides):
    """A ``ReasoningTrainer`` of the tool-calling tiny model with ``tools=[tool]``, and the two turns of every rollout
    in these tests as token ids: a call of ``tool`` with ``key="x"``, then ``"done"``."""
    model, tokenizer = tool_calling_model(tmp_path)
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path / "out"), **{"max_completion_length": 400, **cpu_overrides}),
        **(config_kwargs or {}),
    )
    trainer = tr.ReasoningTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=make_prompts(),
        processing_class=tokenizer,
        tools=[tool],
    )
    call = f'<tool_call>\n{{"name": "{tool.__name__}", "arguments": {{"key": "x"}}}}\n</tool_call>'
    turns = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in (call, "done")]
    return trainer, turns


def _first_turn_calls_the_tool(trainer, turns) -> list[int]:
    """The random tiny model never calls a tool: TRL's ``_generate_single_turn`` is replaced by a stand-in sampler
    whose first turn is ``turns[0]`` (the call) and whose turn after a tool response is ``turns[1]``. Returns the list
    each call appends its number of prompts to."""
    decode = trainer._tokenizer.decode
    sampled: list[int] = []

    def stand_in(prompt_ids, *rest, **kwargs):
        sampled.append(len(prompt_ids))
        after_a_tool = "<tool_response>" in decode(prompt_ids[0])
        return [turns[1] if after_a_tool else turns[0] for _ in prompt_ids], None

    trainer._generate_single_turn = stand_in
    return sampled


def _sampler_logps_of(batch: dict, weights_at_step: list[dict], trainer) -> tuple[list, list]:
    """The sampled tokens' log-probs of ``batch`` recomputed (float64, each sequence alone) under the weights at the
    beginning of step 0 and of step 1."""
    from conftest import logps_under

    prompt_ids = unpadded_rows(batch, "prompt_ids", "prompt_mask")
    completion_ids = unpadded_rows(batch, "completion_ids", "completion_mask")
    temperature = trainer.args.temperature
    return tuple(
        logps_under(trainer.model, weights, prompt_ids, completion_ids, temperature) for weights in weights_at_step[:2]
    )


def slow_lookup(key: str) -> str:
    """Looks a key up.

    Args:
        key: The key.
    """
    time.sleep(30)
    return key


def lookup(key: str) -> str:
    """Looks a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


def test_in_trl_s_own_loop_a_hanging_tool_ends_its_turn_with_the_timeout_as_its_response(tmp_path):
    """The random tiny model never calls a tool, so the first turn of every rollout is a call written out (a stand-in
    sampler at TRL's ``_generate_single_turn``); everything after it is TRL's loop with the guard: the call times out,
    the model reads the error, the next turn is sampled after it, and the failure is logged by name."""
    seen = []

    def records_completions(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    trainer, turns = _tool_trainer(tmp_path, slow_lookup, records_completions, max_steps=1, tool_call_timeout=0.5)
    sampled_turns = _first_turn_calls_the_tool(trainer, turns)
    started = time.perf_counter()
    with pytest.warns(UserWarning, match=r"Tool 'slow_lookup' failed: ToolCallTimeout: tool 'slow_lookup' did not"):
        trainer.train()
    assert time.perf_counter() - started < 25  # 8 rollouts x 0.5 s, not 8 x 30 s
    assert sampled_turns == [8, 8]  # the call, then the turn after the tool's (error) response
    assert logged_metric(trainer, "tools/call_frequency") == [1.0]
    assert logged_metric(trainer, "tools/failure_frequency") == [1.0]
    assert logged_metric(trainer, "tools/failures/slow_lookup") == [8.0]
    assert [message["role"] for message in seen[0]] == ["assistant", "tool", "assistant"]
    assert "did not answer within 0.5 s" in seen[0][1]["content"] and seen[0][2]["content"] == "done"


def test_the_kl_in_the_reward_counts_the_model_s_tokens_not_the_tool_s(tmp_path, monkeypatch):
    """With ``kl_in_reward`` (RLOO's KL), the sequence KL sums the model's own tokens: the tool's response is not the
    policy's choice (TRL's loss leaves it out by ``tool_mask``; the KL in the reward must too)."""
    from trl_reasoning.trainer import rollout

    trainer, turns = _tool_trainer(
        tmp_path,
        lookup,
        lambda completions, **kwargs: [0.0] * len(completions),
        config_kwargs={"kl_in_reward": True},
        max_steps=1,
        beta=0.05,
    )
    _first_turn_calls_the_tool(trainer, turns)
    masks = []
    real_sequence_kl = rollout.sequence_kl

    def recording(old, ref, mask):
        masks.append(mask.clone())
        return real_sequence_kl(old, ref, mask)

    monkeypatch.setattr(rollout, "sequence_kl", recording)
    trainer.train()
    (mask,) = masks
    model_tokens = len(turns[0]) + len(turns[1])
    assert mask.sum(dim=1).tolist() == [model_tokens] * mask.size(0)  # the tool's response and its template are out


@pytest.mark.parametrize("staleness", [pytest.param(None, id="synchronous"), pytest.param(1, id="inline-k1")])
def test_a_two_turn_sample_token_by_token(tmp_path, staleness):
    """A rollout of call, tool response, answer: the completion is the three end to end with the tool's tokens exactly
    as TRL's template renders them, the mask is 1 on the model's tokens and 0 on the tool's, and with asynchronous
    rollouts the sampler's log-probs of the model's tokens are those of the weights ``k`` steps earlier (an
    independent float64 recomputation), every turn from that one version."""
    settings = (
        {} if staleness is None else dict(async_rollouts=True, async_generator="inline", max_staleness=staleness)
    )
    trainer, turns = _tool_trainer(tmp_path, lookup, max_steps=2, **settings)
    suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "lookup", "content": "value of x"}])
    _first_turn_calls_the_tool(trainer, turns)
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()

    expected_ids = turns[0] + suffix + turns[1]
    expected_mask = [1] * len(turns[0]) + [0] * len(suffix) + [1] * len(turns[1])
    for batch in batches:
        for ids, mask, length in zip(
            batch["completion_ids"], batch["tool_mask"], batch["completion_mask"].sum(dim=1), strict=True
        ):
            assert ids[: int(length)].tolist() == expected_ids
            assert mask[: int(length)].tolist() == expected_mask
    if staleness is None:
        return
    # step 1's batch was sampled by the weights at the start of step 0, not by those at the start of step 1
    batch = batches[1]
    behaviour, current = _sampler_logps_of(batch, weights_at_step, trainer)
    model_tokens = torch.tensor(expected_mask, dtype=torch.bool)
    for row, (mu, old, now) in enumerate(zip(batch["sampling_per_token_logps"], behaviour, current, strict=True)):
        mu = mu[: len(expected_ids)].double()
        assert torch.allclose(mu[model_tokens], old[model_tokens], atol=1e-5), row
        assert not torch.allclose(mu[model_tokens], now[model_tokens], atol=1e-3), row


@pytest.mark.slow
def test_the_generator_process_samples_every_turn_with_the_batch_s_behaviour_weights(tmp_path):
    """``async_generator="process"`` with ``tools``: the first turn is sampled ahead by the worker (written out here as
    a call: the random tiny model never calls a tool), TRL's loop runs the tool when the batch is trained, and the
    next turn is sampled by the same worker with the batch's behaviour weights (those of one step earlier), not the
    current ones: its tokens' sampler log-probs match a float64 recomputation under the earlier weights."""
    trainer, turns = _tool_trainer(
        tmp_path,
        lookup,
        config_kwargs=dict(async_rollouts=True, async_generator="process", max_staleness=1),
        max_steps=2,
        max_completion_length=300,
    )
    assert trainer.async_rollouts.snapshot_reason.startswith("tool calls")
    first_turn = turns[0]
    suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "lookup", "content": "value of x"}])
    pipeline = trainer.async_rollouts.pipeline
    real_collect = pipeline.collect

    def first_turn_is_a_call(step, prompts):
        rollout = real_collect(step, prompts)
        rows = len(rollout["completion_ids"])
        # a list per row: TRL's tool loop extends each row's in place
        return {
            **rollout,
            "completion_ids": [list(first_turn) for _ in range(rows)],
            "logprobs": [[0.0] * len(first_turn) for _ in range(rows)],
        }

    pipeline.collect = first_turn_is_a_call
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()

    assert logged_metric(trainer, "tools/call_frequency") == [1.0, 1.0]
    batch = batches[1]  # sampled ahead at step 0, its second turn sampled at step 1
    completion_ids = unpadded_rows(batch, "completion_ids", "completion_mask")
    start = len(first_turn) + len(suffix)
    behaviour, current = _sampler_logps_of(batch, weights_at_step, trainer)
    for row, ids in enumerate(completion_ids):
        assert ids[:start] == first_turn + suffix and len(ids) > start, row
        mask = batch["tool_mask"][row, : len(ids)].tolist()
        assert mask == [1] * len(first_turn) + [0] * len(suffix) + [1] * (len(ids) - start), row
        mu = batch["sampling_per_token_logps"][row, start : len(ids)].double()
        assert torch.allclose(mu, behaviour[row][start:], atol=1e-4), row
        assert not torch.allclose(mu, current[row][start:], atol=1e-3), row
