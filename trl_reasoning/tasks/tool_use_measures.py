"""Measuring a model on the tool-use task (``trl_reasoning.tasks.tool_use``): rollouts sampled as TRL's tool loop
makes them (:func:`rollouts`: the same prompt ids, response parser, tool runs, suffix tokens and completion budget),
and what they show (:func:`summarize`: the tool-call rate, the share of call attempts that parse, calls with the right
factors, accuracy). ``bench/tool_use.py`` measures base -> warm start -> RL with them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .tool_use import TOOLS, prompt_ids, tool_answer_reward, tool_suffix_ids

# ------------------------------------------------------------------------------------------------------ measurements


def _first_turn(completion: Any) -> dict:
    return completion[0] if isinstance(completion, list) and completion else {}


def called_tool(completion: Any) -> bool:
    """Whether the first turn parsed into at least one tool call (what TRL's loop then runs)."""
    return bool(_first_turn(completion).get("tool_calls"))


def attempted_call(completion: Any) -> bool:
    """Whether the first turn parsed into a call or holds ``<tool_call>`` (an unparsable call stays in the text)."""
    return called_tool(completion) or "<tool_call>" in str(_first_turn(completion).get("content") or "")


def well_formed_call(completion: Any) -> bool:
    """Whether the first turn parsed into calls of ``multiply``, each with exactly the integer arguments ``a``, ``b``."""
    calls = _first_turn(completion).get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if function.get("name") != "multiply" or not isinstance(arguments, dict) or set(arguments) != {"a", "b"}:
            return False
        if any(isinstance(v, bool) or not isinstance(v, int) for v in arguments.values()):
            return False
    return bool(calls)


def right_factors(completion: Any, a: int, b: int) -> bool:
    """Whether the first call is well formed and multiplies the question's factors (in either order)."""
    if not well_formed_call(completion):
        return False
    arguments = _first_turn(completion)["tool_calls"][0]["function"]["arguments"]
    return sorted((arguments["a"], arguments["b"])) == sorted((a, b))


def summarize(
    completions: Sequence[Sequence[Any]], answers: Sequence[int], factors: Sequence[tuple[int, int]] | None = None
) -> dict[str, Any]:
    """
    The measurements of ``completions[i]``, the completions of question ``i`` (as many for each), whose product is
    ``answers[i]``: ``tool_call_rate`` (first turn parsed into a call), ``attempt_rate`` (parsed, or ``<tool_call>``
    in the text), ``well_formed_rate`` (valid ``multiply`` calls among attempts), ``accuracy`` (mean reward), and
    ``accuracy_with_call``, ``accuracy_without_call``; with ``factors``, ``right_factors_rate`` (calls of the
    question's factors). A rate with nothing to count is ``nan``. ``correct_counts`` (per question) feed pass@k
    (``trl_reasoning.evaluation.pass_at_k``, a layer this one does not import).
    """
    flat = [(c, answer) for group, answer in zip(completions, answers, strict=True) for c in group]
    n = len(completions[0]) if completions else 0
    if not flat or any(len(group) != n for group in completions):
        raise ValueError("summarize: every question needs the same number (at least one) of completions.")
    rewards = tool_answer_reward([c for c, _ in flat], [a for _, a in flat])
    calls = [called_tool(c) for c, _ in flat]
    attempts = [attempted_call(c) for c, _ in flat]

    def share(values: list, where: list[bool] | None = None) -> float:
        chosen = [v for v, w in zip(values, where, strict=True) if w] if where is not None else values
        return sum(chosen) / len(chosen) if chosen else float("nan")

    out: dict[str, Any] = {
        "tool_call_rate": share(calls),
        "attempt_rate": share(attempts),
        "well_formed_rate": share([well_formed_call(c) for c, _ in flat], attempts),
        "accuracy": share(rewards),
        "accuracy_with_call": share(rewards, calls),
        "accuracy_without_call": share(rewards, [not c for c in calls]),
        "num_prompts": len(completions),
        "num_samples": n,
        "correct_counts": [int(sum(rewards[i * n : (i + 1) * n])) for i in range(len(completions))],
    }
    if factors is not None:
        pairs = [pair for group, pair in zip(completions, factors, strict=True) for _ in group]
        out["right_factors_rate"] = share([right_factors(c, *pair) for (c, _), pair in zip(flat, pairs)], calls)
    return out


# ------------------------------------------------------------------------------------------------------- rollouts


@dataclass
class Rollout:
    """One completion as TRL's tool loop leaves it: ``completion`` (the messages reward functions get),
    ``completion_ids`` (the model's turns and the tool-response suffixes) and ``tool_mask`` (0 on the suffixes)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    tool_mask: list[int]
    completion: list[dict]


def _run_tools(calls: list[dict], tools: dict[str, Callable]) -> list[dict]:
    """The tool messages of ``calls``, run as TRL runs them (an exception or an unknown tool is an error result)."""
    messages = []
    for call in calls:
        name = call["function"]["name"] if call.get("type") == "function" else call.get("name", "unknown")
        try:
            if call.get("type") != "function":
                raise ValueError(f"Unsupported tool call type: {call.get('type')}")
            if name not in tools:
                raise ValueError(f"Tool {name} not found.")
            result: Any = tools[name](**call["function"]["arguments"])
        except Exception as error:  # any failure is the tool's result, as in TRL
            result = {"error": str(error)}
        messages.append({"role": "tool", "name": name, "content": str(result)})
    return messages


def _cache_argument() -> str:
    """The name of a key/value cache argument in the installed transformers (``cache``, once ``past_key_values``)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _sample_turns(model, tokenizer, prefix_cache, prefix, tails, max_new_tokens: int, sampling: dict) -> list[list]:
    """One turn for each ``prefix + tail``: the prefix's key/value cache is shared, each tail padded between the prefix
    and itself (masked; positions skip the padding). Each turn stops after its first end-of-turn token."""
    import torch
    from transformers import GenerationConfig

    width, pad, eos = max(len(tail) for tail in tails), tokenizer.pad_token_id, tokenizer.eos_token_id
    rows = [prefix + [pad] * (width - len(tail)) + tail for tail in tails]
    mask = [[1] * len(prefix) + [0] * (width - len(tail)) + [1] * len(tail) for tail in tails]
    cache = copy.deepcopy(prefix_cache)
    cache.batch_repeat_interleave(len(tails))
    config = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos, **sampling)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(rows, device=model.device),
            attention_mask=torch.tensor(mask, device=model.device),
            generation_config=config,
            **{_cache_argument(): cache},
        )
    return [row[: row.index(eos) + 1] if eos in row else row for row in out[:, len(rows[0]) :].tolist()]


def rollouts(
    model,
    tokenizer,
    prompts: list[list[dict]],
    num_samples: int = 1,
    greedy: bool = False,
    temperature: float = 1.0,
    max_completion_length: int = 64,
    max_tool_calling_iterations: int = 2,
    tools: Sequence[Callable] = TOOLS,
    batch_size: int = 64,
) -> list[list[Rollout]]:
    """
    ``num_samples`` completions of each prompt with tool calls run between turns, as TRL's tool loop
    (``GRPOTrainer._tool_call_loop``) makes them: each turn parsed with the tokenizer's response parser, each call
    run, the tool-response suffix appended to the model's own ids (no re-tokenizing) and the next turn sampled from
    the whole; ``max_completion_length`` bounds a completion, tool tokens included (a tool response that would pass it
    is dropped, a later turn cut); at most ``max_tool_calling_iterations`` rounds of calls. Sampling is unrestricted
    (``top_k=0``, ``top_p=1``) at ``temperature``, or greedy. The prompts' common prefix (system message and tools
    section) is computed once and shared. Returns, per prompt, its ``num_samples`` :class:`Rollout` s.
    """
    from trl.chat_template_utils import parse_response

    model.eval()
    table, tools = {tool.__name__: tool for tool in tools}, list(tools)
    rendered = [prompt_ids(tokenizer, messages, tools) for messages in prompts]
    prefix, prefix_cache = _shared_prefix(model, rendered)
    shared = len(prefix)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    sampling = {"do_sample": False} if greedy else sampling
    items = [p for p in range(len(prompts)) for _ in range(num_samples)]
    states: list[Rollout] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        tails = [rendered[p][shared:] for p in chunk]
        firsts = _sample_turns(model, tokenizer, prefix_cache, prefix, tails, max_completion_length, sampling)
        batch = [
            Rollout(
                rendered[p], ids, [1] * len(ids), [parse_response(tokenizer, ids, prefix=rendered[p], tools=tools)]
            )
            for p, ids in zip(chunk, firsts)
        ]
        active = [state for state in batch if state.completion[-1].get("tool_calls")]
        for _ in range(max_tool_calling_iterations):
            kept = _with_tool_responses(active, table, tokenizer, max_completion_length)
            if not kept:
                break
            tails = [state.prompt_ids[shared:] + state.completion_ids for state in kept]
            budgets = [max_completion_length - len(state.completion_ids) for state in kept]
            turns = _sample_turns(model, tokenizer, prefix_cache, prefix, tails, max(1, max(budgets)), sampling)
            active = []
            for state, ids, budget in zip(kept, turns, budgets, strict=True):
                context, ids = state.prompt_ids + state.completion_ids, ids[:budget]
                state.completion_ids += ids
                state.tool_mask += [1] * len(ids)
                if ids:  # TRL adds no message for a turn cut to nothing
                    state.completion.append(parse_response(tokenizer, ids, prefix=context, tools=tools))
                    active += [state] if state.completion[-1].get("tool_calls") else []
        states += batch
    return [states[p * num_samples : (p + 1) * num_samples] for p in range(len(prompts))]


def _shared_prefix(model, rendered: list[list[int]]) -> tuple[list[int], Any]:
    """The prompts' longest common prefix (one token short of the shortest prompt) and the model's cache of it."""
    import torch

    shared = 0
    while shared < min(len(ids) for ids in rendered) - 1 and len({ids[shared] for ids in rendered}) == 1:
        shared += 1
    prefix = rendered[0][:shared]
    with torch.no_grad():
        output = model(input_ids=torch.tensor([prefix], device=model.device), use_cache=True)
    return prefix, getattr(output, _cache_argument())


def _with_tool_responses(active: list[Rollout], table: dict, tokenizer, max_completion_length: int) -> list[Rollout]:
    """Each rollout whose last turn called tools, with the calls run and their responses appended (TRL's suffix
    tokens, masked); those whose response would pass ``max_completion_length`` are left as they are and out."""
    kept = []
    for state in active:
        messages = _run_tools(state.completion[-1]["tool_calls"], table)
        suffix = tool_suffix_ids(tokenizer, messages)
        if len(state.completion_ids) + len(suffix) > max_completion_length:
            continue  # TRL drops the tool response: the completion stays as it is
        state.completion.extend(messages)
        state.completion_ids += suffix
        state.tool_mask += [0] * len(suffix)
        kept.append(state)
    return kept
