"""Sampling-based evaluation during and after training: pass@k, accuracy, reward and completion length.

[`evaluate_pass_at_k`] samples `n` completions per prompt of a dataset with a model and scores them with reward
functions that take TRL's reward-function arguments. [`PassAtKCallback`] runs it every `eval_steps` inside any
`transformers.Trainer` with a causal LM and a tokenizer: every trl-reasoning trainer and TRL's own `GRPOTrainer`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback

from .pass_at_k import mean_pass_at_k

RewardFunc = Callable[..., list]


def _reward_name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _as_list(funcs: RewardFunc | Sequence[RewardFunc]) -> list[RewardFunc]:
    funcs = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
    if not funcs:
        raise ValueError("reward_funcs is empty: pass at least one reward function to judge the completions.")
    for func in funcs:
        if not callable(func):
            raise TypeError(f"reward_funcs must be callables (TRL reward functions), got {func!r}.")
    return funcs


def _prompt_texts(tokenizer, prompts: list) -> list[str]:
    texts = []
    for prompt in prompts:
        if isinstance(prompt, list):  # conversational
            texts.append(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        else:
            texts.append(prompt)
    return texts


@torch.no_grad()
def _sample(model, tokenizer, texts: list[str], num_samples: int, greedy: bool, generation: dict) -> dict[str, Any]:
    """Generate for `texts`; return decoded completions, their token ids (up to EOS) and lengths, row-major."""
    device = next(model.parameters()).device
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    prompt_length = encoded["input_ids"].shape[1]
    kwargs = dict(generation)
    if greedy:
        kwargs.update(do_sample=False, num_return_sequences=1, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, num_return_sequences=num_samples)
    output = model.generate(**encoded, **kwargs)
    completion_ids = output[:, prompt_length:]
    eos_ids = set(_eos_ids(model, tokenizer))
    ids, lengths = [], []
    for row in completion_ids.tolist():
        kept = []
        for token in row:
            if token in eos_ids:
                kept.append(token)
                break
            if token == tokenizer.pad_token_id and tokenizer.pad_token_id not in eos_ids:
                break
            kept.append(token)
        ids.append(kept)
        lengths.append(len(kept))
    texts_out = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return {"texts": texts_out, "ids": ids, "lengths": lengths}


def _eos_ids(model, tokenizer) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else [e for e in (eos or []) if e is not None]


def _score(
    funcs: list[RewardFunc], prompts: list, completions: list, completion_ids: list, columns: dict[str, list]
) -> list[float]:
    totals = [0.0] * len(completions)
    for func in funcs:
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if values is None or len(values) != len(completions):
            raise ValueError(
                f"Reward function {_reward_name(func)} returned {0 if values is None else len(values)} values for "
                f"{len(completions)} completions."
            )
        for i, value in enumerate(values):
            value = float("nan") if value is None else float(value)
            if math.isnan(value):
                value = 0.0  # TRL's convention: a reward function returns None when it does not apply
            totals[i] += value
    return totals


def _score_samples(
    funcs: list[RewardFunc], prompts: list, columns: dict[str, list], sampled: dict[str, Any], repeat: int
) -> list[float]:
    """Rewards of `repeat` sampled completions per prompt (row-major), with the prompts and columns repeated."""
    conversational = isinstance(prompts[0], list)
    completions = [[{"role": "assistant", "content": text}] if conversational else text for text in sampled["texts"]]
    repeated = {key: [value for value in values for _ in range(repeat)] for key, values in columns.items()}
    prompts = [prompt for prompt in prompts for _ in range(repeat)]
    return _score(funcs, prompts, completions, sampled["ids"], repeated)


def _checked_ks(ks: Sequence[int], num_samples: int) -> list[int]:
    """The distinct `k` values, sorted, each checked to lie in `[1, num_samples]`."""
    ks = sorted({int(k) for k in ks})
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    bad = [k for k in ks if not 1 <= k <= num_samples]
    if bad:
        raise ValueError(f"every k in ks must be between 1 and num_samples={num_samples}; got {bad}.")
    return ks


def _evaluation_rows(dataset, max_prompts: int | None) -> list[dict]:
    """The dataset's rows (the first `max_prompts` of them), checked to be non-empty and to have a prompt."""
    rows = [dict(row) for row in dataset]
    if max_prompts is not None:
        rows = rows[:max_prompts]
    if not rows:
        raise ValueError("The evaluation dataset is empty.")
    if "prompt" not in rows[0]:
        raise ValueError(f"The evaluation dataset needs a 'prompt' column; it has {sorted(rows[0])}.")
    return rows


def _rank_share(rows: list[dict], world: int, rank: int) -> tuple[list[dict], list[float]]:
    """This process's slice of the rows, padded to the same length on every process, and which rows are real
    (1.0) rather than padding (0.0)."""
    per_rank = math.ceil(len(rows) / world)
    local = rows[rank * per_rank : (rank + 1) * per_rank]
    valid = [1.0] * len(local) + [0.0] * (per_rank - len(local))
    local = local + [rows[-1]] * (per_rank - len(local))  # equal generate calls on every rank (ZeRO-3, FSDP)
    return local, valid


@dataclass
class _SamplingPlan:
    """How `evaluate_pass_at_k` samples and judges: the reward functions, `n`, the `generate` keyword arguments,
    prompts per call, the success threshold and whether it also decodes greedily."""

    funcs: list[RewardFunc]
    num_samples: int
    generation: dict[str, Any]
    batch_size: int
    success_threshold: float
    greedy: bool


def _batch_stats(model, tokenizer, batch: list[dict], plan: _SamplingPlan) -> list[list[float]]:
    """Per prompt of `batch`: correct samples, reward sum, length sum, greedy correct (0.0 without greedy)."""
    n = plan.num_samples
    prompts = [row["prompt"] for row in batch]
    texts = _prompt_texts(tokenizer, prompts)
    columns = {key: [row[key] for row in batch] for key in batch[0] if key != "prompt"}
    sampled = _sample(model, tokenizer, texts, n, greedy=False, generation=plan.generation)
    rewards = _score_samples(plan.funcs, prompts, columns, sampled, n)
    greedy_rewards = None
    if plan.greedy:
        greedy_sample = _sample(model, tokenizer, texts, 1, greedy=True, generation=plan.generation)
        greedy_rewards = _score_samples(plan.funcs, prompts, columns, greedy_sample, 1)
    stats = []
    for i in range(len(batch)):
        chunk = slice(i * n, (i + 1) * n)
        stats.append(
            [
                float(sum(r >= plan.success_threshold for r in rewards[chunk])),
                float(sum(rewards[chunk])),
                float(sum(sampled["lengths"][chunk])),
                float(greedy_rewards[i] >= plan.success_threshold) if plan.greedy else 0.0,
            ]
        )
    return stats


def _sampled_stats(model, tokenizer, rows: list[dict], plan: _SamplingPlan, bar) -> list[list[float]]:
    """`_batch_stats` of every row, `plan.batch_size` prompts per call, in eval mode with left padding; the model's
    mode and the tokenizer's padding side are restored and `bar` closed afterwards."""
    was_training = model.training
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    model.eval()
    stats = []
    try:
        for start in range(0, len(rows), plan.batch_size):
            batch = rows[start : start + plan.batch_size]
            stats += _batch_stats(model, tokenizer, batch, plan)
            bar.update(len(batch))
    finally:
        bar.close()
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return stats


def _gathered_table(stats: list[list[float]], valid: list[float], accelerator) -> torch.Tensor:
    """This process's per-prompt stats with their `valid` flag as a last column, gathered over processes."""
    table = torch.tensor([s + [v] for s, v in zip(stats, valid)], dtype=torch.float64)
    if accelerator is not None and accelerator.num_processes > 1:
        table = accelerator.gather(table.to(accelerator.device)).cpu()
    return table


def _pass_at_k_metrics(table: torch.Tensor, ks: list[int], num_samples: int, greedy: bool) -> dict[str, float]:
    """The metrics from the real prompts' rows of `[correct, reward sum, length sum, greedy correct, valid]`."""
    counts = [int(c) for c in table[:, 0].tolist()]
    num_prompts = len(counts)
    metrics = {f"pass@{k}": mean_pass_at_k(counts, num_samples, k) for k in ks}
    if greedy:
        metrics["accuracy"] = float(table[:, 3].mean())
    metrics["reward"] = float(table[:, 1].sum()) / (num_prompts * num_samples)
    metrics["mean_length"] = float(table[:, 2].sum()) / (num_prompts * num_samples)
    metrics["num_prompts"] = float(num_prompts)
    metrics["num_samples"] = float(num_samples)
    return metrics


def _is_main_process(accelerator) -> bool:
    """Whether this process reports (the only one without an accelerator)."""
    return accelerator is None or accelerator.is_main_process


def _progress_bar(local: int, total: int, num_samples: int, world: int, shown: bool) -> tqdm:
    """The bar over this process's ``local`` prompts of ``total``."""
    description = f"pass@k eval ({total} prompts x {num_samples} samples, {world} process{'es' * (world > 1)})"
    return tqdm(total=local, desc=description, unit="prompt", disable=not shown)


@contextlib.contextmanager
def _seeded(seed: int | None, rank: int, model) -> Iterator[None]:
    """torch's random state seeded with ``seed + rank`` inside, restored after (``None``: untouched)."""
    if seed is None:
        yield
        return
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed + rank)
        yield


def evaluate_pass_at_k(
    model,
    tokenizer,
    dataset,
    reward_funcs: RewardFunc | Sequence[RewardFunc],
    num_samples: int = 8,
    ks: Sequence[int] = (1, 8),
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 64,
    success_threshold: float = 1.0,
    greedy: bool = True,
    max_prompts: int | None = None,
    accelerator=None,
    progress: bool = False,
    seed: int | None = 0,
) -> dict[str, float]:
    r"""
    Sample `num_samples` completions per prompt and report unbiased pass@k, greedy accuracy, reward and length.

    Args:
        model ([`~transformers.PreTrainedModel`]): A causal LM (unwrapped: not DDP/DeepSpeed-wrapped).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer; conversational prompts go through its
            chat template with a generation prompt.
        dataset (`datasets.Dataset` or `list[dict]`): Rows with a `"prompt"` (text or list of messages) and any
            columns the reward functions read (e.g. `"answer"`), passed to them as keyword arguments, as TRL does.
        reward_funcs (`Callable` or `Sequence[Callable]`): TRL-style reward functions `f(prompts, completions,
            completion_ids, **columns) -> list[float]`. Their sum is a completion's reward; a completion is correct
            when that sum is `>= success_threshold` (*optional*, defaults to `1.0`).
        num_samples (`int`, defaults to `8`): Completions sampled per prompt (`n` of pass@k).
        ks (`Sequence[int]`, defaults to `(1, 8)`): The `k` values to report; each must be `<= num_samples`.
        max_new_tokens (`int`, defaults to `256`), temperature (`float`, defaults to `1.0`), top_p (`float`,
            defaults to `1.0`), top_k (`int`, defaults to `0`, which disables top-k filtering): Sampling parameters.
        batch_size (`int`, defaults to `64`): Prompts per `generate` call.
        greedy (`bool`, defaults to `True`): Also decode greedily once per prompt and report its accuracy.
        max_prompts (`int`, *optional*): Evaluate only the first `max_prompts` rows.
        accelerator (`accelerate.Accelerator`, *optional*): With several processes, each evaluates a slice of the
            prompts and the counts are gathered; every process returns the same metrics.
        progress (`bool`, defaults to `False`): Show a progress bar (this process's prompts; main process only).
        seed (`int` or `None`, defaults to `0`): Sample with this seed (plus the process index) in a fork of torch's
            random state: the same command gives the same numbers, and training's random stream is left as it was.

    Returns:
        `dict[str, float]`: `pass@{k}` for every `k` (averaged over prompts), `accuracy` (greedy, if `greedy`),
        `reward` (mean reward of the sampled completions), `mean_length` (mean sampled completion length in tokens,
        EOS included), `num_prompts`, `num_samples`.
    """
    ks = _checked_ks(ks, num_samples)
    rows = _evaluation_rows(dataset, max_prompts)
    world, rank = (accelerator.num_processes, accelerator.process_index) if accelerator is not None else (1, 0)
    local, valid = _rank_share(rows, world, rank)
    generation = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)
    generation.update(pad_token_id=tokenizer.pad_token_id, synced_gpus=world > 1)
    plan = _SamplingPlan(_as_list(reward_funcs), num_samples, generation, batch_size, success_threshold, greedy)
    bar = _progress_bar(len(local), len(rows), num_samples, world, shown=progress and _is_main_process(accelerator))
    with _seeded(seed, rank, model):
        table = _gathered_table(_sampled_stats(model, tokenizer, local, plan, bar), valid, accelerator)
    return _pass_at_k_metrics(table[table[:, 4] > 0], ks, num_samples, greedy)


class PassAtKCallback(TrainerCallback):
    r"""
    Every `eval_steps` optimizer steps, sample `num_samples` completions per held-out prompt and log pass@k, greedy
    accuracy, mean reward and mean completion length to the trainer's loggers (console, W&B, TensorBoard, …), under
    `eval_pass_at_k/pass@{k}`, `eval_pass_at_k/accuracy`, `eval_pass_at_k/reward`, `eval_pass_at_k/mean_length`.
    The prefix keeps them apart from the trainer's own evaluation loop, whose `eval_reward` is the mean training
    reward on `eval_dataset` (this callback's `reward` is the mean under its own `reward_funcs` over its samples).

    Works with any `transformers.Trainer` whose model is a causal LM and whose `processing_class` is its tokenizer:
    every trl-reasoning trainer and TRL's `GRPOTrainer`. Metrics go through `transformers.Trainer.log` itself, so
    `GRPOTrainer`'s buffered training metrics are neither flushed nor mixed in.

    Args:
        trainer ([`~transformers.Trainer`]):
            The trainer to evaluate; add the callback with `trainer.add_callback(callback)`.
        eval_dataset (`datasets.Dataset` or `list[dict]`):
            Held-out rows with a `"prompt"` and the columns the reward functions read.
        reward_funcs (`Callable` or `Sequence[Callable]`, *optional*):
            Reward functions judging correctness; defaults to the trainer's `reward_funcs` that are callables.
        num_samples (`int`, *optional*, defaults to `8`):
            Completions per prompt (`n`).
        ks (`Sequence[int]`, *optional*, defaults to `(1, 8)`):
            The `k` values to log (each `<= num_samples`).
        eval_steps (`int`, *optional*):
            Evaluate every this many steps; defaults to `args.eval_steps`, else `args.logging_steps`.
        eval_on_start (`bool`, *optional*, defaults to `False`):
            Also evaluate before the first step (step 0).
        max_new_tokens (`int`, *optional*):
            Defaults to `args.max_completion_length` (256 when the trainer has none).
        temperature (`float`, *optional*):
            Defaults to `args.temperature` (1.0 when the trainer has none). `top_p`/`top_k` likewise.
        metric_prefix (`str`, *optional*, defaults to `"eval_pass_at_k/"`):
            Prefix of every logged key.
        **kwargs:
            Passed to [`evaluate_pass_at_k`] (`batch_size`, `success_threshold`, `greedy`, `max_prompts`).
    """

    def __init__(
        self,
        trainer,
        eval_dataset,
        reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
        num_samples: int = 8,
        ks: Sequence[int] = (1, 8),
        eval_steps: int | None = None,
        eval_on_start: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        metric_prefix: str = "eval_pass_at_k/",
        **kwargs,
    ):
        self.trainer = trainer
        self.metric_prefix = metric_prefix
        self.eval_dataset = eval_dataset
        if reward_funcs is None:
            reward_funcs = [f for f in getattr(trainer, "reward_funcs", []) if not hasattr(f, "forward")]
            if not reward_funcs:
                raise ValueError(
                    "PassAtKCallback: the trainer has no reward function to judge completions; pass reward_funcs."
                )
        self.reward_funcs = _as_list(reward_funcs)
        args = trainer.args
        self.eval_steps = eval_steps or getattr(args, "eval_steps", None) or args.logging_steps
        if isinstance(self.eval_steps, float) and self.eval_steps < 1:
            self.eval_steps = max(1, int(self.eval_steps * max(1, args.max_steps)))
        self.eval_steps = int(self.eval_steps)
        self.eval_on_start = eval_on_start
        kwargs.setdefault("seed", getattr(args, "seed", 0))  # every evaluation samples alike: paired over steps
        self.options = dict(
            num_samples=num_samples,
            ks=ks,
            max_new_tokens=max_new_tokens or getattr(args, "max_completion_length", None) or 256,
            temperature=temperature if temperature is not None else getattr(args, "temperature", 1.0),
            top_p=top_p if top_p is not None else getattr(args, "top_p", 1.0),
            top_k=top_k if top_k is not None else (getattr(args, "top_k", 0) or 0),
            **kwargs,
        )
        # validate early, with the same messages as evaluate_pass_at_k
        bad = [k for k in ks if not 1 <= k <= num_samples]
        if bad:
            raise ValueError(
                f"PassAtKCallback: every k in ks must be between 1 and num_samples={num_samples}; got {bad}."
            )
        self.history: list[dict[str, float]] = []

    def evaluate(self, step: int) -> dict[str, float]:
        """Run the evaluation now and log it at `step`; returns the metrics (keys prefixed with `metric_prefix`)."""
        from trl.models.utils import unwrap_model_for_generation

        trainer = self.trainer
        # gathers ZeRO-3 / FSDP parameters for generation, as TRL's trainers do
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            metrics = evaluate_pass_at_k(
                model,
                trainer.processing_class,
                self.eval_dataset,
                self.reward_funcs,
                accelerator=trainer.accelerator,
                **self.options,
            )
        logs = {
            f"{self.metric_prefix}{key}": value
            for key, value in metrics.items()
            if key not in ("num_prompts", "num_samples")
        }
        from transformers import Trainer

        # The base implementation: GRPOTrainer.log would flush its buffered training metrics into this entry. The
        # callback handler's on_log clears `should_log`, which would cancel a training log due at this very step.
        should_log = trainer.control.should_log
        Trainer.log(trainer, logs)
        trainer.control.should_log = should_log
        self.history.append({"step": step, **logs})
        return logs

    def on_train_begin(self, args, state, control, **kwargs):
        if self.eval_on_start and state.global_step == 0:
            self.evaluate(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > 0 and state.global_step % self.eval_steps == 0:
            self.evaluate(state.global_step)
