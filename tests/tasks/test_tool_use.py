"""The tool-use task (``trl_reasoning.tasks.tool_use``): its questions, reward and measurements, its warm-start
transcripts and rollouts against TRL's own tool loop, its warm start's cache and its command-line wiring."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import cpu_args
from datasets import Dataset

import trl_reasoning as tr
from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k
from trl_reasoning.models.loading import load_tokenizer
from trl_reasoning.models.tiny import build_model, build_tokenizer, save_tiny_model
from trl_reasoning.tasks import TASKS
from trl_reasoning.tasks import tool_use as tu
from trl_reasoning.tasks import tool_use_measures as measures


def _call(a, b, name="multiply") -> dict:
    return {"type": "function", "function": {"name": name, "arguments": {"a": a, "b": b}}}


def _with_tool(a: int, b: int, final: str | None, result: int | None = None) -> list[dict]:
    """A completion as TRL's loop hands it to the reward: a call, the tool's response, and ``final`` when given."""
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [_call(a, b)]},
        {"role": "tool", "name": "multiply", "content": str(a * b if result is None else result)},
    ]
    return messages + ([{"role": "assistant", "content": final}] if final is not None else [])


def _prose(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# --------------------------------------------------------------------------------------------------------- questions


def test_questions_are_seeded_disjoint_and_hard():
    task = tu.ToolUseTask(num_train=300, num_test=40, seed=3)
    train, test = task.questions()
    assert (train, test) == tu.ToolUseTask(num_train=300, num_test=40, seed=3).questions()
    assert test != tu.ToolUseTask(num_train=300, num_test=40, seed=4).questions()[1]
    assert len(train) == 300 and len(test) == 40
    assert not {frozenset((a, b)) for _, a, b in train} & {frozenset((a, b)) for _, a, b in test}
    assert len({(a, b) for _, a, b in train}) == 300  # distinct
    for question, a, b in train + test:
        assert 10 <= min(a, b) and max(a, b) <= 999 and min(len(str(a)), len(str(b))) == 2
        assert str(a) in question and str(b) in question
    rows = task.rl_rows("test")
    assert rows[0]["answer"] == test[0][1] * test[0][2]
    assert rows[0]["prompt"] == [
        {"role": "system", "content": tu.SYSTEM_PROMPT},
        {"role": "user", "content": test[0][0]},
    ]
    with pytest.raises(ValueError, match="split"):
        task.rl_rows("validation")


def test_the_multiply_tool_has_a_schema_and_refuses_non_integers():
    from transformers.utils.chat_template_utils import get_json_schema

    schema = get_json_schema(tu.multiply)["function"]
    assert schema["name"] == "multiply" and schema["parameters"]["required"] == ["a", "b"]
    assert schema["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first factor."}
    assert tu.multiply(37, 48) == 1776
    with pytest.raises(TypeError):
        tu.multiply("37", 48)
    with pytest.raises(TypeError):
        tu.multiply(True, 48)


# ------------------------------------------------------------------------------------------------------------ reward


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        (_with_tool(37, 48, "37 times 48 is 1776."), 1.0),
        (_with_tool(37, 48, "So the answer is 1,776"), 1.0),  # thousands separator
        (_with_tool(37, 48, "37 times 48 is 1766."), 0.0),  # copied wrongly
        (_with_tool(37, 48, "1776 is the product of 37 and 48."), 0.0),  # the last number is 48
        (_with_tool(37, 48, "It is the product."), 0.0),  # no number
        (_with_tool(37, 48, None), 0.0),  # only the tool wrote the product
        (_with_tool(37, 48, ""), 0.0),
        (_prose("37 x 48 = 1776"), 1.0),  # right without a call: correctness only
        (_prose("37 x 48 = 1728"), 0.0),
        ("37 x 48 = 1776", 1.0),  # a plain-text completion
        ([], 0.0),
    ],
)
def test_the_reward_reads_the_last_number_of_the_last_assistant_message(completion, reward):
    assert tu.tool_answer_reward([completion], [1776]) == [reward]


# ------------------------------------------------------------------------------------------------------ measurements


def test_call_helpers_tell_calls_attempts_and_well_formed_calls_apart():
    assert measures.called_tool(_with_tool(3, 4, "12")) and measures.well_formed_call(_with_tool(3, 4, "12"))
    assert not measures.called_tool(_prose("12")) and not measures.attempted_call(_prose("12"))
    broken = _prose('<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": }}\n</tool_call>')
    assert (
        measures.attempted_call(broken) and not measures.called_tool(broken) and not measures.well_formed_call(broken)
    )
    for bad in (_call(3, 4, name="add"), _call("3", 4), _call(3.0, 4), _call(True, 4)):
        completion = [{"role": "assistant", "content": "", "tool_calls": [bad]}]
        assert (
            measures.called_tool(completion)
            and measures.attempted_call(completion)
            and not measures.well_formed_call(completion)
        )
    extra = [{"role": "assistant", "content": "", "tool_calls": [_call(3, 4), {"type": "function", "function": {}}]}]
    assert not measures.well_formed_call(extra)
    assert measures.right_factors(_with_tool(4, 3, "12"), 3, 4) and not measures.right_factors(
        _with_tool(4, 5, "20"), 3, 4
    )


def test_summarize_on_hand_built_completions():
    # question 1 (12 = 3 x 4): a right call and answer; a broken call attempt. question 2 (30 = 5 x 6): a call of
    # the wrong factors answered with what the tool said; a right answer in prose.
    broken = _prose('<tool_call>{"name": "multiply", "arguments": {"a": 3}</tool_call>')
    completions = [[_with_tool(3, 4, "3 times 4 is 12."), broken], [_with_tool(5, 7, "It is 35."), _prose("30")]]
    out = measures.summarize(completions, [12, 30], factors=[(3, 4), (5, 6)])
    assert out["tool_call_rate"] == 0.5 and out["attempt_rate"] == 0.75
    assert out["well_formed_rate"] == pytest.approx(2 / 3)  # 2 of the 3 attempts parsed into valid calls
    assert out["right_factors_rate"] == 0.5
    assert out["accuracy"] == 0.5 and out["accuracy_with_call"] == 0.5 and out["accuracy_without_call"] == 0.5
    assert out["correct_counts"] == [1, 1] and (out["num_prompts"], out["num_samples"]) == (2, 2)
    assert mean_pass_at_k(out["correct_counts"], 2, 1) == 0.5 and mean_pass_at_k(out["correct_counts"], 2, 2) == 1.0
    none = measures.summarize([[_prose("12")]], [12])
    assert math.isnan(none["well_formed_rate"]) and math.isnan(none["accuracy_with_call"])
    with pytest.raises(ValueError, match="same number"):
        measures.summarize([[_prose("1")], [_prose("1"), _prose("2")]], [1, 1])


# -------------------------------------------------------------------------------------- TRL's loop, token for token


def _tool_calling_tokenizer():
    """The tiny character tokenizer with the tool-calling template and TRL's parser (kept in memory: the saved and
    reloaded one loses the whitespace the parser needs)."""
    return tu.tool_tokenizer(build_tokenizer())


def _tool_calling_model_path(tmp_path) -> str:
    path = save_tiny_model(tmp_path / "tool-model", seed=0)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))  # the tools section
    return str(path)


def _trainer(tmp_path, max_completion_length: int = 400):
    return tr.DAPOTrainer(
        model=_tool_calling_model_path(tmp_path),
        reward_funcs=tu.tool_answer_reward,
        args=tr.DAPOConfig(
            **cpu_args(
                output_dir=str(tmp_path / "out"),
                max_completion_length=max_completion_length,
                max_tool_calling_iterations=2,
                num_generations=2,
                per_device_train_batch_size=4,
            )
        ),
        train_dataset=Dataset.from_list(tu.ToolUseTask(num_test=4).rl_rows("train")[:8]),
        processing_class=_tool_calling_tokenizer(),
        tools=list(tu.TOOLS),
    )


def _trl_generate(trainer, prompts: list) -> tuple:
    """TRL's ``_generate`` of ``prompts`` (tool calls included), with the per-rollout tool tables its scoring step
    builds first."""
    trainer._sync_tool_dicts = [{tool.__name__: tool for tool in tu.TOOLS} for _ in prompts]
    trainer._async_tool_dicts = [{} for _ in prompts]
    return trainer._generate(prompts)


def _scripted_turns(tokenizer, a: int, b: int):
    """A stand-in sampler: a call of multiply(a, b) first, the answer after a tool response (as transcripts have it)."""
    end = [tokenizer.eos_token_id]
    call = tokenizer.encode(tu.call_text(a, b), add_special_tokens=False) + end
    answer = tokenizer.encode(tu.ANSWER_TEXT.format(a=a, b=b, product=a * b), add_special_tokens=False) + end

    def turn(tails_or_prompts):
        return [answer if "<tool_response>" in tokenizer.decode(ids) else call for ids in tails_or_prompts]

    return turn


def test_transcripts_are_the_token_sequences_of_trl_s_tool_loop(tmp_path):
    trainer = _trainer(tmp_path)
    tokenizer = trainer.processing_class
    task = tu.ToolUseTask(num_test=4)
    question, a, b = task.questions()[1][0]
    turn = _scripted_turns(tokenizer, a, b)
    trainer._generate_single_turn = lambda prompt_ids, *args, **kwargs: (turn(prompt_ids), None)
    prompt = task.messages(question)
    prompt_ids, completion_ids, tool_mask, completions, *_ = _trl_generate(trainer, [prompt, prompt])

    ids, mask = tu.transcript(tokenizer, prompt, a, b)
    assert prompt_ids[0] + completion_ids[0] == ids
    assert [0] * len(prompt_ids[0]) + tool_mask[0] == mask  # the loss mask is TRL's tool mask on the completion
    unmasked_after_prompt = tokenizer.decode([t for t, m in list(zip(ids, mask))[len(prompt_ids[0]) :] if not m])
    assert f"<tool_response>\n{a * b}\n</tool_response>" in unmasked_after_prompt  # the tool's tokens are not trained
    assert unmasked_after_prompt.endswith("<|im_start|>assistant\n")
    assert completions[0][0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": a, "b": b}}
    assert completions[0][1] == {"role": "tool", "name": "multiply", "content": str(a * b)}
    assert tu.tool_answer_reward(completions, [a * b, a * b]) == [1.0, 1.0]
    suffix = trainer._get_tool_suffix_ids([completions[0][1]])
    assert tu.tool_suffix_ids(tokenizer, [completions[0][1]]) == suffix


@pytest.mark.parametrize("room", ["everything", "no tool response", "a cut answer"])
def test_rollouts_build_what_trl_s_loop_builds(tmp_path, monkeypatch, room):
    """The rollouts of the measurements are TRL's, turn for turn, also where ``max_completion_length`` drops the tool
    response (TRL's rollback) or cuts the answer."""
    tokenizer = _tool_calling_tokenizer()
    a, b = 12, 345
    call = len(tokenizer.encode(tu.call_text(a, b))) + 1
    suffix = len(tu.tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": str(a * b)}]))
    budget = {"everything": 400, "no tool response": call + 5, "a cut answer": call + suffix + 5}[room]
    trainer = _trainer(tmp_path, max_completion_length=budget)
    tokenizer = trainer.processing_class
    task = tu.ToolUseTask(num_test=4)
    prompts = [task.messages(q) for q, _, _ in task.questions()[1][:2]]
    turn = _scripted_turns(tokenizer, a, b)
    trainer._generate_single_turn = lambda prompt_ids, *args, **kwargs: ([t[:budget] for t in turn(prompt_ids)], None)
    _, trl_completion_ids, trl_tool_mask, trl_completions, *_ = _trl_generate(trainer, prompts)

    def scripted(model, tokenizer, cache, prefix, tails, max_new_tokens, sampling):
        return [t[:max_new_tokens] for t in turn([prefix + tail for tail in tails])]

    monkeypatch.setattr(measures, "_sample_turns", scripted)
    model = build_model(tokenizer)
    model.config.max_position_embeddings = 4096
    ours = measures.rollouts(model, tokenizer, prompts, max_completion_length=budget, max_tool_calling_iterations=2)
    for i, (rollout,) in enumerate(ours):
        assert rollout.completion_ids == trl_completion_ids[i]
        assert rollout.tool_mask == trl_tool_mask[i]
        assert rollout.completion == trl_completions[i]
    assert len(ours[0][0].completion) == (1 if room == "no tool response" else 3)
    assert all(len(rollout.completion_ids) <= budget for (rollout,) in ours)
    if room == "a cut answer":
        assert len(ours[0][0].completion_ids) == budget and ours[0][0].completion[-1]["content"] == "12 ti"


def test_the_shared_prefix_samples_what_plain_generation_samples():
    """Greedy turns from the shared prefix cache, the tails padded between prefix and tail, equal the turns that
    ``generate`` samples from each whole prompt alone."""
    tokenizer = _tool_calling_tokenizer()
    model = build_model(tokenizer, seed=1)
    model.config.max_position_embeddings = 4096
    task = tu.ToolUseTask(num_test=3)
    prompts = [task.messages(q) for q, _, _ in task.questions()[1]]
    rendered = [tu.prompt_ids(tokenizer, p) for p in prompts]
    assert len({len(ids) for ids in rendered}) > 1  # tails of different lengths
    ours = measures.rollouts(model, tokenizer, prompts, greedy=True, max_completion_length=8)
    for ids, (rollout,) in zip(rendered, ours):
        plain = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), do_sample=False,
            max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )[0, len(ids) :].tolist()  # fmt: skip
        if tokenizer.eos_token_id in plain:
            plain = plain[: plain.index(tokenizer.eos_token_id) + 1]
        assert rollout.completion_ids == plain and rollout.prompt_ids == ids


def test_transcripts_match_the_template_with_the_real_tokenizer():
    """With SmolLM2's BPE tokenizer the transcript (turns tokenized on their own) is the template's tokenization of
    the whole conversation, so the warm start trains on what the model would write in one piece."""
    from trl_reasoning.models.pretrained import SMOLLM2, cache_root

    folder = cache_root() / "models" / SMOLLM2.folder_name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not converted here (trl-reasoning model)")
    tokenizer = tu.tool_tokenizer(load_tokenizer(folder))
    task = tu.ToolUseTask(num_test=5)
    for question, a, b in task.questions()[1]:
        ids, mask = tu.transcript(tokenizer, task.messages(question), a, b)
        conversation = task.messages(question) + [
            {"role": "assistant", "content": "", "tool_calls": [_call(a, b)]},
            {"role": "tool", "name": "multiply", "content": str(a * b)},
            {"role": "assistant", "content": tu.ANSWER_TEXT.format(a=a, b=b, product=a * b)},
        ]
        whole = tokenizer.apply_chat_template(conversation, tools=list(tu.TOOLS), tokenize=True, return_dict=False)
        assert whole[: len(ids)] == ids and tokenizer.decode(whole[len(ids) :]) == "\n"
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert trained == f"{tu.call_text(a, b)}<|im_end|>{tu.ANSWER_TEXT.format(a=a, b=b, product=a * b)}<|im_end|>"


# ------------------------------------------------------------------------------------------------------ warm start


def test_the_warm_start_is_trained_once_and_cached(tmp_path, monkeypatch):
    model_path = _tool_calling_model_path(tmp_path)
    task = tu.ToolUseTask(num_train=8, num_test=2)
    settings = tu.ToolWarmStart(max_steps=2, batch_size=2, lora_rank=2)
    folder, cached = tu.warm_start(
        model_path, task, settings, cache_dir=tmp_path / "cache", tokenizer=build_tokenizer()
    )
    assert not cached and (folder / "config.json").is_file()
    record = json.loads((folder / "warm_start.json").read_text())
    assert record["settings"]["max_steps"] == 2 and len(record["losses"]) == 2
    assert load_tokenizer(folder).chat_template == tu.tool_chat_template()  # saved with the tool-calling template

    def fail(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(tu, "_train_warm_start", fail)
    assert tu.warm_start(model_path, task, settings, cache_dir=tmp_path / "cache") == (folder, True)
    other = tu.ToolWarmStart(max_steps=3, batch_size=2, lora_rank=2)
    assert tu.cache_key(model_path, task, other) != tu.cache_key(model_path, task, settings)


def test_warm_start_batches_cover_distinct_training_questions():
    task = tu.ToolUseTask(num_train=16, num_test=2)
    batches = tu.warm_start_batches(_tool_calling_tokenizer(), task, tu.ToolWarmStart(max_steps=3, batch_size=4))
    assert [len(batch) for batch in batches] == [4, 4, 4]
    assert len({tuple(ids) for batch in batches for ids, _ in batch}) == 12


# ------------------------------------------------------------------------------------------------------------- CLI


def test_the_cli_task_trains_with_the_tool_and_the_prepared_model(tmp_path, monkeypatch):
    from trl_reasoning import cli

    spec = TASKS.get("tool_multiply")
    assert spec.build is tu.ToolUseTask and spec.tools == (tu.multiply,) and spec.template() == tu.tool_chat_template()
    prepared = _tool_calling_model_path(tmp_path)
    asked = []
    monkeypatch.setattr(tu, "warm_start", lambda path: (asked.append(path) or prepared, True))
    received = {}

    class Recorder:
        def __init__(self, **kwargs):
            received.update(kwargs)
            raise SystemExit("recorded")

    data, training, model, _ = cli.parse("dapo", ["--task", "tool_multiply", "--model_name_or_path", str(tmp_path),
                                               "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])  # fmt: skip
    with pytest.raises(SystemExit, match="recorded"):
        cli.train(data, training, model, Recorder)
    assert asked == [str(tmp_path)] and received["model"] == prepared
    assert received["tools"] == [tu.multiply]
    assert received["processing_class"].chat_template == tu.tool_chat_template()
    assert received["reward_funcs"][0] is tu.tool_answer_reward
    assert received["train_dataset"][0]["answer"] == tu.ToolUseTask().rl_rows("train")[0]["answer"]


def test_other_tasks_get_no_tools():
    received = {}

    class Recorder:
        def __init__(self, **kwargs):
            received.update(kwargs)
            raise SystemExit("recorded")

    from trl_reasoning import cli

    data, training, model, _ = cli.parse("dapo", ["--task", "arithmetic", "--model_name_or_path", "/nonexistent",
                                               "--use_cpu", "true"])  # fmt: skip
    with pytest.raises(SystemExit, match="recorded"):
        cli.train(data, training, model, Recorder)
    assert "tools" not in received and received["processing_class"] is None and received["model"] == "/nonexistent"


def test_one_turn_evaluations_refuse_a_tool_task(tmp_path, monkeypatch):
    """``trl-reasoning eval`` and ``--pass_at_k_samples`` sample one turn without tools: a tool task is refused (before
    any warm start) instead of measured without its tool."""
    from trl_reasoning import cli

    with pytest.raises(ValueError, match="runs no tools"):
        cli.run(["eval", "--model_name_or_path", str(tmp_path), "--task", "tool_multiply"])
    monkeypatch.setattr(tu, "warm_start", lambda path: pytest.fail("warm-started before the refusal"))
    data, training, model, _ = cli.parse("dapo", ["--task", "tool_multiply", "--model_name_or_path", str(tmp_path),
                                                  "--pass_at_k_samples", "4", "--use_cpu", "true"])  # fmt: skip
    with pytest.raises(ValueError, match="--pass_at_k_samples samples one turn and runs no tools"):
        cli.train(data, training, model, object)


def test_the_cli_task_trains_a_step_through_trl_s_tool_loop(tmp_path, monkeypatch):
    """``trl-reasoning dapo --task tool_multiply``, end to end on the tiny model (its warm start stood in for): TRL
    builds its tool loop (the metrics of ``tools=``) and the model is saved."""
    from trl_reasoning import cli

    prepared = _tool_calling_model_path(tmp_path)
    monkeypatch.setattr(tu, "warm_start", lambda path: (prepared, True))
    trainer = cli.run(
        ["dapo", "--task", "tool_multiply", "--model_name_or_path", prepared, "--output_dir", str(tmp_path / "out"),
         "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2",
         "--max_completion_length", "8", "--max_tool_calling_iterations", "2", "--use_cpu", "true", "--bf16", "false",
         "--report_to", "none", "--dataloader_num_workers", "0", "--activation_checkpointing", "false",
         "--dynamic_sampling", "false"]
    )  # fmt: skip
    assert trainer.tools == [tu.multiply] and trainer.state.global_step == 1
    assert any("tools/call_frequency" in entry for entry in trainer.state.log_history)
    assert (tmp_path / "out" / "config.json").is_file()
