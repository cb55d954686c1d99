"""Multiplication with a ``multiply`` tool: a small instruct model learns to call the tool it needs, through TRL's
own tool loop (``tools=[multiply]`` given to the trainer, as ``trl.GRPOTrainer`` takes it).

- Questions such as ``What is 37 times 48?`` (two- and three-digit factors, which SmolLM2-135M-Instruct gets wrong in
  its head), seeded, with disjoint training and held-out sets (no factor pair of one is in the other, either order).
- Prompts are rendered with TRL's ``qwen2_5_chat_template`` (ChatML like SmolLM2's own, plus a tools section and
  ``<tool_call>{json}</tool_call>`` calls, which TRL parses), each with a short system message of its own.
- :func:`tool_answer_reward` is correctness only: 1 when the last number of the *last assistant message* is the
  product; no call is required, a product only the tool wrote does not count (the measures report the call rate).
- The untrained model never writes a call, so RL alone has no signal: :func:`warm_start` first trains a short LoRA
  warm start (merged, cached on disk) on transcripts built token for token as TRL's loop builds a rollout
  (:func:`transcript`), the loss on the model's own tokens only.
- ``trl_reasoning.tasks.tool_use_measures`` samples as TRL's tool loop does (``rollouts``: same ids, parser, tool
  runs and budget) and measures what the samples show (``summarize``).
- ``--task tool_multiply`` warm-starts the given model (cached) and gives the trainer ``tools=[multiply]`` and the
  template. ``bench/tool_use.py`` measures base -> warm start -> RL.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..utils.cached_folders import built_once, default_cache_dir
from .registry import TASKS, CliTask

#: The system message of every prompt (without one, the template would add "You are Qwen, ...").
SYSTEM_PROMPT = "You are a helpful assistant."
#: The question's phrasings (one drawn per question).
PHRASINGS = (
    "What is {a} times {b}?",
    "Multiply {a} by {b}.",
    "What is the product of {a} and {b}?",
    "Compute {a} * {b}.",
)
#: The answer turn of the warm start's transcripts (it ends with the product, as the reward reads it).
ANSWER_TEXT = "{a} times {b} is {product}."
WARM_START_FORMAT = 1  # bumped when the warm start's recipe changes in a way its settings do not capture

_NUMBER = re.compile(r"-?\d+")


def multiply(a: int, b: int) -> int:
    """
    Multiply two integers and return their product.

    Args:
        a: The first factor.
        b: The second factor.
    """
    if any(isinstance(value, bool) or not isinstance(value, int) for value in (a, b)):
        raise TypeError(f"multiply takes two integers, got {a!r} and {b!r}")
    return a * b


#: The tools of the task, as the trainer's ``tools=`` takes them.
TOOLS: tuple[Callable, ...] = (multiply,)


def tool_chat_template() -> str:
    """TRL's ChatML template with a tools section (``trl.chat_template_utils.qwen2_5_chat_template``), whose calls
    TRL parses. Imported when asked for: ``--help`` does not import TRL."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def tool_tokenizer(tokenizer):
    """``tokenizer`` with :func:`tool_chat_template`, TRL's response parser and a pad token (returned, changed)."""
    from trl.chat_template_utils import add_response_schema

    tokenizer.chat_template = tool_chat_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return add_response_schema(tokenizer)


# --------------------------------------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class ToolUseTask:
    """
    Seeded multiplication questions for a model with a ``multiply`` tool: ``num_train`` training and ``num_test``
    held-out ones (drawn first; no factor pair of theirs is in training, in either order), all distinct, with factors
    of ``factor_digits`` digits (one kind of question per pair, drawn with equal chance), phrased from
    :data:`PHRASINGS`, each prompt with the system message ``system_prompt``; ``seed`` fixes all of it.
    """

    factor_digits: tuple[tuple[int, int], ...] = ((2, 2), (2, 3), (3, 2))
    num_train: int = 512
    num_test: int = 32
    system_prompt: str = SYSTEM_PROMPT
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "factor_digits", tuple(tuple(pair) for pair in self.factor_digits))
        valid = all(len(p) == 2 and all(isinstance(d, int) and 1 <= d <= 6 for d in p) for p in self.factor_digits)
        if not self.factor_digits or not valid:
            raise ValueError(
                f"ToolUseTask: factor_digits are pairs of digit counts in 1..6, got {self.factor_digits}."
            )
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError(f"ToolUseTask: num_train and num_test must be >= 1 ({self.num_train}, {self.num_test}).")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def questions(self) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        """``(train, test)`` lists of distinct ``(question, a, b)``, deterministic in ``seed``."""
        rng = random.Random(self.seed)
        seen: set[tuple[int, int]] = set()

        def draw(count: int, excluded: set[frozenset[int]]) -> list[tuple[str, int, int]]:
            out = []
            for _ in range(100 * count + 1000):
                if len(out) == count:
                    return out
                da, db = rng.choice(self.factor_digits)
                a, b = rng.randrange(10 ** (da - 1), 10**da), rng.randrange(10 ** (db - 1), 10**db)
                if (a, b) not in seen and frozenset((a, b)) not in excluded:
                    seen.add((a, b))
                    out.append((rng.choice(PHRASINGS).format(a=a, b=b), a, b))
            raise ValueError(f"ToolUseTask: cannot draw {count} distinct questions of {self.factor_digits}.")

        test = draw(self.num_test, set())
        return draw(self.num_train, {frozenset((a, b)) for _, a, b in test}), test

    def messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]

    def rl_rows(self, split: str) -> list[dict[str, Any]]:
        """Conversational prompts with their ``answer`` column (the product) for ``split`` in ``"train"``, ``"test"``."""
        if split not in ("train", "test"):
            raise ValueError(f"ToolUseTask.rl_rows: split must be 'train' or 'test', got {split!r}.")
        train, test = self.questions()
        return [{"prompt": self.messages(q), "answer": a * b} for q, a, b in (train if split == "train" else test)]


# ------------------------------------------------------------------------------------------------------------ reward


def last_number(text: str) -> int | None:
    """The last integer written in ``text`` (thousands separators ignored), or ``None``."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


def final_text(completion: Any) -> str:
    """The content of the completion's last assistant message (a string completion is its own text): tool messages
    are skipped, so a product that only the tool wrote is not the model's answer."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if message.get("role", "assistant") == "assistant":
            return message.get("content") if isinstance(message.get("content"), str) else ""
    return ""


def tool_answer_reward(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 when the last number of the last assistant message equals the ``answer`` column, else 0.0. Correctness
    only: a right answer without a tool call counts, a right product only in a tool response does not."""
    return [float(last_number(final_text(c)) == int(a)) for c, a in zip(completions, answer, strict=True)]


# -------------------------------------------------------------------------------------------- TRL's token sequences


def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The ids TRL's tool loop appends after the model's call turn (its end-of-turn token included): the template's
    rendering of ``tool_messages`` and of the next assistant header, cut where a one-call conversation's rendering
    ends (at its last end-of-turn token when the template writes one), as ``GRPOTrainer`` cuts it."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    conversation = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
    after = tokenizer.apply_chat_template(
        conversation + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ends = [i for i, token in enumerate(before) if token == tokenizer.eos_token_id]
    before = before[: ends[-1] + 1] if ends else before
    if after[: len(before)] != before:
        raise ValueError("tool_suffix_ids: the conversation rendered with the tool response does not extend it.")
    return after[len(before) :]


def prompt_ids(tokenizer, messages: list[dict], tools: Sequence[Callable] = TOOLS) -> list[int]:
    """The prompt ids TRL generates from: the chat template with the tools section and the assistant header."""
    return tokenizer.apply_chat_template(
        messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def call_text(a: int, b: int) -> str:
    """The call turn's text as the template writes a call of ``multiply(a, b)``."""
    return f"<tool_call>\n{json.dumps({'name': 'multiply', 'arguments': {'a': a, 'b': b}})}\n</tool_call>"


def transcript(tokenizer, messages: list[dict], a: int, b: int) -> tuple[list[int], list[int]]:
    """
    A warm-start transcript, as TRL's tool loop builds the rollout in which the model calls ``multiply(a, b)`` and
    answers: prompt ids, the call turn and its end-of-turn token, the tool-response suffix TRL appends, the answer turn
    and its end-of-turn token.

    Returns:
        `tuple[list[int], list[int]]`: the ids and the loss mask (1 on the model's own tokens, the two turns; 0 on the
        prompt and on the tool-response suffix).
    """
    end = [tokenizer.eos_token_id]
    prompt = prompt_ids(tokenizer, messages)
    call = tokenizer.encode(call_text(a, b), add_special_tokens=False) + end
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": str(a * b)}])
    answer = tokenizer.encode(ANSWER_TEXT.format(a=a, b=b, product=a * b), add_special_tokens=False) + end
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    return prompt + call + suffix + answer, mask


# ----------------------------------------------------------------------------------------------------- warm start


@dataclass(frozen=True)
class ToolWarmStart:
    """
    The supervised warm start on tool-call transcripts: ``max_steps`` AdamW steps at the constant ``learning_rate``,
    ``batch_size`` transcripts a step (each of a distinct training question), LoRA of rank ``lora_rank`` (alpha twice
    that) on every linear layer, merged into the saved model; ``seed`` fixes the LoRA init and the order.

    Short on purpose, to leave the model partly competent so that RL has something to learn: four steps leave
    SmolLM2-135M-Instruct calling the tool in about 60% of its samples at temperature 1 and right in about 27%
    (measured on 16 held-out questions; 12 steps: 100% and 92%; 3 steps: 36% and 11%).
    """

    max_steps: int = 4
    batch_size: int = 4
    learning_rate: float = 5e-4
    lora_rank: int = 16
    seed: int = 0


def _model_fingerprint(model_path: str | Path) -> str:
    """The hash of a model folder's config and weight files (what the warm start starts from)."""
    folder, digest = Path(model_path), hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")) + [folder / "config.json"]:
        if path.is_file():
            digest.update(path.name.encode())
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def cache_key(model_path: str | Path, task: ToolUseTask, settings: ToolWarmStart) -> str:
    """A short hash of the model's files, the task, the settings and the library versions."""
    import peft
    import torch
    import transformers
    import trl

    payload = {
        "format": WARM_START_FORMAT,
        "model": _model_fingerprint(model_path),
        "task": task.to_dict(),
        "settings": asdict(settings),
        "versions": [torch.__version__, transformers.__version__, trl.__version__, peft.__version__],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def warm_start_batches(tokenizer, task: ToolUseTask, settings: ToolWarmStart) -> list[list[tuple[list, list]]]:
    """The warm start's batches of ``(ids, loss mask)`` transcripts: distinct training questions in a seeded order."""
    train, _ = task.questions()
    order = list(range(len(train)))
    random.Random(settings.seed).shuffle(order)
    needed = settings.max_steps * settings.batch_size
    chosen = [train[order[i % len(order)]] for i in range(needed)]
    rows = [transcript(tokenizer, task.messages(q), a, b) for q, a, b in chosen]
    return [rows[i : i + settings.batch_size] for i in range(0, needed, settings.batch_size)]


def _train_warm_start(model_path: str, tokenizer, task: ToolUseTask, settings: ToolWarmStart, staging: Path) -> Path:
    """Train the warm start under ``staging``; return the saved folder (merged model, tool tokenizer, and a
    ``warm_start.json`` with the settings and the losses)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rank = settings.lora_rank
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    losses = []
    for batch in warm_start_batches(tokenizer, task, settings):
        width = max(len(ids) for ids, _ in batch)
        pad = [width - len(ids) for ids, _ in batch]
        input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * n for (ids, _), n in zip(batch, pad)])
        attention = torch.tensor([[1] * len(ids) + [0] * n for (ids, _), n in zip(batch, pad)])
        labels = [[t if m else -100 for t, m in zip(ids, mask)] + [-100] * n for (ids, mask), n in zip(batch, pad)]
        loss = model(input_ids=input_ids, attention_mask=attention, labels=torch.tensor(labels)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 4))
    print(f"tool-use warm start: {settings.max_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    model_dir = staging / "model"
    model.merge_and_unload().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    record = {"base_model": str(model_path), "task": task.to_dict(), "settings": asdict(settings), "losses": losses}
    (model_dir / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")
    return model_dir


def warm_start(
    model_path: str | Path,
    task: ToolUseTask | None = None,
    settings: ToolWarmStart | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    tokenizer=None,
) -> tuple[Path, bool]:
    """
    ``(folder, cached)``: the model of the folder ``model_path`` warm-started on tool-call transcripts of ``task``
    (default ``ToolUseTask()``) with ``settings`` (default ``ToolWarmStart()``), saved with its tokenizer (``tokenizer``,
    by default ``AutoTokenizer``'s, given the tool template) in ``cache_dir`` (default ``$TRL_REASONING_CACHE`` or
    ``~/.cache/trl-reasoning``) under a hash of both, the model's files and the library versions; trained unless
    cached (or ``use_cache=False``), written atomically. Processes that ask at once (the ranks of one run) train it
    once: the others wait for it under a file lock.
    """
    task, settings = task or ToolUseTask(), settings or ToolWarmStart()
    root = Path(cache_dir) if cache_dir else default_cache_dir()

    def build(staging: Path) -> Path:
        nonlocal tokenizer
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        return _train_warm_start(str(model_path), tool_tokenizer(tokenizer), task, settings, staging)

    return built_once(
        root / f"tool-warm-start-{cache_key(model_path, task, settings)}",
        build,
        lambda folder: (folder / "config.json").is_file() and (folder / "warm_start.json").is_file(),
        use_cache=use_cache,
        exclusive=True,
    )


def warm_started_model(model_path: str) -> str:
    """The command line's model preparation: ``model_path`` warm-started with the default settings (cached)."""
    return str(warm_start(model_path)[0])


TASKS.register(
    CliTask(
        name="tool_multiply",
        help="multiplication with a multiply tool through TRL's tool loop, after a cached tool-call warm start",
        reward="trl_reasoning.tasks.tool_use.tool_answer_reward",
        build=ToolUseTask,
        tools=TOOLS,
        chat_template=tool_chat_template,
        prepare_model=warm_started_model,
    )
)
