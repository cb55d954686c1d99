"""Multi-turn rollouts (``tools=[...]`` and ``environment_factory``) on every generator: synchronous, and
``async_generator="inline"``, ``"process"`` and ``"server"`` at ``k = 1`` and ``k = 2``.

The random tiny model never calls a tool, so the first turn of every rollout is a call written out (at TRL's
``_generate_single_turn`` synchronously and inline, at the pipeline's collection for a generator that sampled it
ahead); everything after it is the real thing: TRL's tool loop runs the tool, or the method of the environment
instance of that rollout, appends its response, and the next turn is sampled by the run's generator (HF ``generate``
in the trainer, the worker process, the stand-in vLLM server of ``test_async_server``). Checked token by token: the
completion is the call, TRL's tool suffix and the next turn, ``tool_mask`` is 1, 0, 1 over them, and the sampler's
log-probs of the next turn are those of the weights ``k`` steps earlier (float64 recomputation), not the current
ones. With environments: the observation ``reset()`` returned is in the prompt the first turn was sampled from, and
the tool answered from that same episode (the instance reset for the row at submission is the one TRL's scoring
hands the row).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from conftest import (
    StopAt,
    cpu_args,
    logged_metric,
    logps_under,
    make_prompts,
    run_torchrun,
    scored_batches,
    tool_calling_model,
    unpadded_rows,
)
from test_async_server import ServerModeGeneration

import trl_reasoning as tr


def lookup(key: str) -> str:
    """Looks a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


class NumberedEpisodes:
    """An environment whose episodes are numbered in the order they start: ``reset`` shows the number, and the tool
    answers with the number of the episode its instance is in."""

    started = 0

    def reset(self, **row) -> str:
        NumberedEpisodes.started += 1
        self.episode, self.calls = NumberedEpisodes.started, 0
        return f" (episode {self.episode})"

    def lookup(self, key: str) -> str:
        """Looks a key up in this episode.

        Args:
            key: The key.
        """
        self.calls += 1
        return f"value of {key} in episode {self.episode}"


class OtherEpisodes(NumberedEpisodes):
    """A second environment, chosen by a row's ``environment`` field (the same tool, another class)."""


class RowEpisodes(NumberedEpisodes):
    """The same tool, with each episode named by its row (so a resumed run starts the same episodes)."""

    def reset(self, **row) -> str:
        self.episode, self.calls = row["prompt"][-1]["content"], 0
        return f" (episode {self.episode})"


GENERATORS = {
    "synchronous": {},
    **{
        f"{name}-k{k}": dict(async_rollouts=True, async_generator=name, max_staleness=k)
        for name in ("inline", "process", "server")
        for k in (1, 2)
    },
}
SERVER = dict(use_vllm=True, vllm_mode="server")


def _trainer(
    tmp_path,
    generator: str,
    kind: str,
    environment=NumberedEpisodes,
    peft_config=None,
    train_dataset=None,
    **overrides,
):
    """A ``ReasoningTrainer`` of the tiny model (room for TRL's tool section, a template that renders tool calls)
    with ``tools=[lookup]`` or ``environment_factory=environment``, its reward recording what each rollout saw."""
    path, tokenizer = tool_calling_model(tmp_path)
    settings = {**GENERATORS[generator], **(SERVER if generator.startswith("server") else {})}
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path / "out"), max_completion_length=200, **{**settings, **overrides})
    )
    seen: list[dict] = []

    def records(prompts, completions, environments=None, **kwargs) -> list[float]:
        for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            tool = [message["content"] for message in completion if message["role"] == "tool"]
            episode = environments[row] if environments else None
            seen.append(
                {
                    "prompt": prompt[-1]["content"],
                    "tool": tool,
                    "episode": None if episode is None else (episode.episode, episode.calls),
                    "environment": (kwargs["environment"][row], type(episode).__name__)
                    if "environment" in kwargs
                    else None,
                }
            )
        return [float(i % 2) for i in range(len(completions))]  # differ within every group: each step moves

    multi_turn = {"tools": [lookup]} if kind == "tools" else {"environment_factory": environment}
    trainer = tr.ReasoningTrainer(
        model=path,
        reward_funcs=records,
        args=args,
        train_dataset=make_prompts() if train_dataset is None else train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        **multi_turn,
    )
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'
    return trainer, tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id], seen


def _first_turn_is_the_call(trainer, call: list[int]) -> None:
    """Every rollout's first turn is ``call``; the turns after a tool response are the generator's own."""
    pipeline = trainer.async_rollouts.pipeline if trainer.async_rollouts is not None else None
    if pipeline is not None:  # sampled ahead: the batch the generator returned, its first turn replaced
        collect = pipeline.collect
        if trainer.use_vllm:  # the stand-in server samples a token at a time, each by a whole forward: one token of
            # a first turn (replaced below) and eight of a later one will do
            server = trainer.vllm_generation.vllm_client
            request = server.generate
            server.generate = lambda prompts, n=1, max_tokens=16, **kwargs: request(
                prompts, n=n, max_tokens=1 if n > 1 else min(max_tokens, 8), **kwargs
            )

        def collected(step, prompts):
            rollout = collect(step, prompts)
            rows = len(rollout["completion_ids"])  # a list per row: TRL's tool loop extends each in place
            return {
                **rollout,
                "completion_ids": [list(call) for _ in range(rows)],
                "logprobs": [[0.0] * len(call) for _ in range(rows)],
            }

        pipeline.collect = collected
        return
    own_turn, decode = trainer._generate_single_turn, trainer._tokenizer.decode

    def turn(prompt_ids, *args, **kwargs):
        if "<tool_response>" in decode(prompt_ids[0]):
            return own_turn(prompt_ids, *args, **kwargs)
        return [list(call) for _ in prompt_ids], None

    trainer._generate_single_turn = turn


@pytest.fixture
def server_standin(monkeypatch):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", ServerModeGeneration)


def _check_two_turn_samples(trainer, batches, weights_at_step, seen, call, kind: str, k: int) -> None:
    """Every batch's rollouts are call, tool suffix, next turn with ``tool_mask`` 1, 0, 1 (and, with environments, the
    observation in the prompt and the tool's answer from that episode); with ``k`` the last batch's next turns carry
    the sampler log-probs of the weights ``k`` steps before it, not the current ones."""
    steps = len(batches)
    assert logged_metric(trainer, "tools/call_frequency") == [1.0] * steps
    assert logged_metric(trainer, "tools/failure_frequency") == [0.0] * steps
    if k:
        assert logged_metric(trainer, "async/staleness") == [float(min(g, k)) for g in range(steps)]
    rows = len(batches[0]["completion_ids"])
    decode = trainer._tokenizer.decode
    for g, batch in enumerate(batches):
        prompts = unpadded_rows(batch, "prompt_ids", "prompt_mask")
        completions = unpadded_rows(batch, "completion_ids", "completion_mask")
        for row, ids in enumerate(completions):
            record = seen[g * rows + row]
            (response,) = record["tool"]
            if kind == "tools":
                assert response == "value of x"
            else:  # the episode reset() showed the first turn is the one the tool answered from, on its instance
                episode, calls = record["episode"]
                shown = f" (episode {episode})"
                assert record["prompt"].endswith(shown) and shown.strip() in decode(prompts[row])
                assert response == f"value of x in episode {episode}" and calls == 1
            suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "lookup", "content": response}])
            start = len(call) + len(suffix)
            assert ids[:start] == call + suffix and len(ids) > start, (g, row)
            mask = batch["tool_mask"][row, : len(ids)].tolist()
            assert mask == [1] * len(call) + [0] * len(suffix) + [1] * (len(ids) - start), (g, row)
    if not k:
        return
    # the last batch (staleness k): its next turn was sampled by the weights of k steps earlier, not the current ones
    batch = batches[-1]
    prompts = unpadded_rows(batch, "prompt_ids", "prompt_mask")
    completions = unpadded_rows(batch, "completion_ids", "completion_mask")
    temperature = trainer.args.temperature
    behaviour = logps_under(trainer.model, weights_at_step[steps - 1 - k], prompts, completions, temperature)
    current = logps_under(trainer.model, weights_at_step[steps - 1], prompts, completions, temperature)
    for row, ids in enumerate(completions):
        start = len(ids) - int(batch["tool_mask"][row, : len(ids)].flip(0).cumprod(0).sum())  # the next turn
        mu = batch["sampling_per_token_logps"][row, start : len(ids)].double()
        assert torch.allclose(mu, behaviour[row][start:], atol=1e-4), row
        assert not torch.allclose(mu, current[row][start:], atol=1e-3), row


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tools", "environment"])
@pytest.mark.parametrize("generator", list(GENERATORS))
def test_a_two_turn_sample_on_every_generator_token_by_token(generator, kind, tmp_path, server_standin):
    k = GENERATORS[generator].get("max_staleness", 0)
    trainer, call, seen = _trainer(tmp_path, generator, kind, max_steps=max(k, 1) + 1)  # the last batch k steps stale
    _first_turn_is_the_call(trainer, call)
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()
    _check_two_turn_samples(trainer, batches, weights_at_step, seen, call, kind, k)


@pytest.mark.slow
def test_tools_on_the_generator_process_with_lora(tmp_path):
    """LoRA: the worker samples every turn with the batch's adapter weights (the only trainable ones)."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer, call, seen = _trainer(tmp_path, "process-k1", "environment", max_steps=2, peft_config=lora)
    assert all("lora" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    _first_turn_is_the_call(trainer, call)
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()
    _check_two_turn_samples(trainer, batches, weights_at_step, seen, call, "environment", 1)


@pytest.mark.slow
def test_a_run_with_environments_on_the_generator_process_resumes_as_the_uninterrupted_run(tmp_path):
    """Cut at a checkpoint with two batches in flight (k = 2) and resumed: each batch's episodes start again from its
    row (the same observation, so the checkpoint's sampled first turns are used, not sampled again), the later turns
    are sampled with the restored behaviour weights, and the run trains exactly as the uninterrupted one."""
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2)

    def run(folder: str, stop_at: int | None = None, resume: str | None = None):
        trainer, call, seen = _trainer(tmp_path / folder, "process-k2", "environment", RowEpisodes, **settings)
        _first_turn_is_the_call(trainer, call)
        batches, _ = scored_batches(trainer)
        if stop_at is not None:
            trainer.add_callback(StopAt(stop_at))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train(resume_from_checkpoint=resume)
        assert not [w for w in caught if "sampled again" in str(w.message) or "restarts" in str(w.message)]
        return trainer, batches, seen

    full, full_batches, full_seen = run("full")
    run("cut", stop_at=2)
    resumed, resumed_batches, resumed_seen = run("cut", resume=str(tmp_path / "cut" / "out" / "checkpoint-2"))
    rows = len(full_batches[0]["completion_ids"])
    assert resumed_seen == full_seen[2 * rows :]
    for resumed_batch, full_batch in zip(resumed_batches, full_batches[2:], strict=True):
        assert torch.equal(resumed_batch["completion_ids"], full_batch["completion_ids"])
        assert torch.allclose(resumed_batch["sampling_per_token_logps"], full_batch["sampling_per_token_logps"])
    expected = dict(full.model.named_parameters())
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(param, expected[name], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_two_gloo_processes_run_environments_on_their_generator_processes(tmp_path):
    """Two training processes (torchrun, gloo), each with its generator process and its own episodes: every rollout
    of each rank passes the token-by-token checks, the ranks train the same weights, and no worker outlives train()."""
    run_torchrun(Path(__file__).with_name("multi_turn_worker.py"), str(tmp_path), timeout=600)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [report["processes"] for report in reports] == [2, 2]
    assert reports[0]["episodes"] != reports[1]["episodes"], "each rank runs its own rows' episodes"
    assert reports[0]["weights"] == pytest.approx(reports[1]["weights"], rel=1e-9)
    assert not any(report["worker_left"] for report in reports)


@pytest.mark.slow
def test_several_environments_by_name_on_the_generator_process(tmp_path):
    """``environment_factory={name: class}`` with an ``environment`` column: each row's episode starts, at submission,
    on an instance of the environment its row names, and TRL's scoring hands the row that same instance."""
    from datasets import Dataset

    rows = [{**row, "environment": ("numbered", "other")[i % 2]} for i, row in enumerate(make_prompts())]
    environments = {"numbered": NumberedEpisodes, "other": OtherEpisodes}
    trainer, call, seen = _trainer(
        tmp_path, "process-k1", "environment", environments, train_dataset=Dataset.from_list(rows), max_steps=2
    )
    _first_turn_is_the_call(trainer, call)
    batches, weights_at_step = scored_batches(trainer)
    trainer.train()
    _check_two_turn_samples(trainer, batches, weights_at_step, seen, call, "environment", 1)
    kinds = {record["environment"] for record in seen}
    assert kinds == {("numbered", "NumberedEpisodes"), ("other", "OtherEpisodes")}
