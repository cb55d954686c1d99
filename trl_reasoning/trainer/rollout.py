"""Where a batch comes from: generation rounds, scoring and reward shaping, group selection, prompt sampling.

[`Rollout`] produces what one generation step trains on, as TRL lays it out (the dict ``GRPOTrainer.
_generate_and_score_completions`` returns, with this package's advantages and loss weights): it runs generation rounds
(one, or more for dynamic sampling), shapes their rewards, chooses the groups that train, retires solved prompts,
regroups rows of several rounds (all processes take the same decisions, on gathered rewards), and fixes each row's
advantage and loss weight on the whole batch. How the batch is then trained on is the trainer's loss
(``ReasoningTrainer._compute_loss``).

The rollout never touches TRL's private methods: its host (the trainer) lends it exactly what :class:`RolloutHost`
names (the seam, checked when a trainer is built):

- ``trl_round(inputs)``: TRL's generation and scoring of some rows, with the rewards per function and the completion
  lengths of the gathered batch;
- ``behaviour_logps(output)``: the sampled tokens' log-probabilities under the policy now (RLOO's KL in the reward);
- ``rollout_topk(output, mode)`` and ``check_context_length(output)``;
- the Trainer's state (``args``, ``accelerator``, ``state``, ``train_dataset``) and TRL's (``num_generations(_eval)``,
  ``beta``, ``reward_weights``, ``reward_func_names``, ``_metrics``, ``_logs``, ``_tokenizer``, ``shuffle_dataset``,
  ``environment_factories``), which the trainer's TRL-API guard (``TRL_INSTANCE_ATTRIBUTES``) checks.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from typing import Any, Protocol, runtime_checkable

import torch
from accelerate.utils import gather_object
from datasets import IterableDataset

from ..algorithms.advantages import ADVANTAGE_ESTIMATORS, per_completion
from ..algorithms.batch import (
    TrainBatch,
    batch_advantages_and_weights,
    join_spanning,
    left_padded,
    pad_value,
    split_spanning,
    stack_rows,
)
from ..algorithms.group_selection import (
    GROUP_SELECTIONS,
    GroupPlan,
    SampledRound,
    extra_round_groups,
    group_pass_rates,
    informative_groups,
    is_correctness_reward,
    resolve_group_selection,
    sample_groups,
)
from ..algorithms.prompt_sampling import PromptState, prompt_key
from ..algorithms.shaping import (
    check_binary_rewards,
    clip_rewards,
    combined_rewards,
    normalize_then_sum_rewards,
    sequence_kl,
    token_kl,
)
from ..rewards.wrapping import overlong_penalty
from ..utils.user_warnings import user_stacklevel
from .checkpoints import SAMPLING_STATE_FILE, read_sampling_state, write_json_atomically
from .prompt_sampling_callback import PromptSamplingCallback


@runtime_checkable
class RolloutHost(Protocol):
    """What :class:`Rollout` reads from (and, where marked, writes to) its trainer. Members from
    ``GRPOTrainer.__init__`` are in the TRL-API guard (``trl_reasoning.trainer.trl_api.TRL_INSTANCE_ATTRIBUTES``)."""

    # lent by trl-reasoning's trainer
    def trl_round(self, inputs: list[dict]) -> tuple[dict, torch.Tensor, torch.Tensor]: ...

    def behaviour_logps(self, output: dict) -> torch.Tensor: ...

    def rollout_topk(self, output: dict, mode: str) -> dict[str, torch.Tensor]: ...

    def check_context_length(self, output: dict) -> None: ...

    @property
    def _uses_topk_divergence(self) -> bool: ...

    # transformers.Trainer's
    args: Any
    accelerator: Any
    state: Any
    train_dataset: Any

    # GRPOTrainer's (TRL_INSTANCE_ATTRIBUTES)
    num_generations: int
    num_generations_eval: int
    beta: float
    reward_weights: torch.Tensor
    reward_func_names: list[str]
    _metrics: dict  # written: this package's metrics
    _logs: dict  # written: the advantages of the completions table
    _tokenizer: Any
    shuffle_dataset: bool
    environment_factories: dict | None


class DynamicSamplingWarning(UserWarning):
    """Dynamic sampling ran out of generation rounds before the batch was full of informative groups."""


def loss_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The completion tokens that count in the loss: TRL's completion mask, without tool-output tokens."""
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"]


def task_reward_columns(
    task_reward_funcs: list[str] | None, reward_func_names: list[str], positive_resampling_threshold: float | None
) -> tuple[torch.Tensor, bool]:
    """Which reward functions make the task reward (a bool per function), from ``task_reward_funcs``, and whether that
    is ambiguous for no-positive-resampling (several functions, none named: nothing is retired, with a warning)."""
    available = list(reward_func_names)
    if task_reward_funcs is None:
        ambiguous = positive_resampling_threshold is not None and len(available) > 1
        if ambiguous:
            # Not an error, since TRL trains such a run: retirement waits for the user to say what a pass is.
            warnings.warn(
                f"positive_resampling_threshold={positive_resampling_threshold} retires prompts whose task reward "
                f"passes, but with several reward functions ({', '.join(available)}) the task reward is ambiguous: a "
                "format or length bonus alone could retire a prompt the model never solved. No prompt is retired in "
                "this run (training goes on over every prompt, as in TRL). Set task_reward_funcs to the functions "
                f"that judge correctness to retire prompts, e.g. task_reward_funcs=[{available[0]!r}].",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return torch.ones(len(available), dtype=torch.bool), ambiguous
    unknown = [name for name in task_reward_funcs if name not in available]
    if unknown:
        raise ValueError(
            f"task_reward_funcs names {', '.join(map(repr, unknown))}, which is not a reward function of this "
            f"trainer; its reward functions are {', '.join(map(repr, available))}."
        )
    return torch.tensor([name in task_reward_funcs for name in available], dtype=torch.bool), False


def _environment_owns_prompts(host: RolloutHost) -> bool:
    """No-positive-resampling retires prompts by the text of the dataset's ``prompt`` column. Where an environment
    supplies the prompts (TRL 1.16's ``environment_factory`` with no ``prompt`` column, or no dataset: TRL's placeholder
    rows of empty prompts) every row has the same key, and one passing group would retire them all: nothing is retired
    in such a run, with a warning."""
    dataset = host.train_dataset
    columns = getattr(dataset, "column_names", None)
    if host.environment_factories is None or columns is None or isinstance(dataset, IterableDataset):
        return False
    placeholder = [{"role": "user", "content": ""}]
    if "prompt" in columns and any(prompt != placeholder for prompt in dataset["prompt"]):
        return False
    warnings.warn(
        f"positive_resampling_threshold={host.args.positive_resampling_threshold} retires prompts by the text of the "
        "training dataset's 'prompt' column, but here the environment supplies the prompts (the dataset has "
        f"{'only empty placeholder prompts' if 'prompt' in columns else 'no prompt column'}), so every row would count "
        "as one prompt. No prompt is retired in this run (training goes on as in TRL). Give the dataset a 'prompt' "
        "column that tells tasks apart to retire them, or set positive_resampling_threshold=None to silence this.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return True


class Rollout:
    """The scored, selected generation batches of one trainer (``host``); see the module docstring.

    Args:
        host: the trainer whose TRL machinery generates and scores (``ReasoningTrainer``).
    """

    def __init__(self, host: RolloutHost):
        self.host = host
        args = host.args
        # Which reward functions make the task reward. retirement_off: no-positive-resampling is on, but what a pass
        # is or which prompt passed cannot be told (warned once here, or when the first batch shows it), so nothing
        # more is retired.
        self.task_reward_columns, self.retirement_off = task_reward_columns(
            args.task_reward_funcs, host.reward_func_names, args.positive_resampling_threshold
        )
        if args.positive_resampling_threshold is not None and not self.retirement_off:
            self.retirement_off = _environment_owns_prompts(host)
        self.group_selection = resolve_group_selection(args)
        self.generates_extra_rounds = GROUP_SELECTIONS.get(self.group_selection)().rounds(args.max_num_gen_batches) > 1
        self.last_batch: TrainBatch | None = None
        self._prompt_keys: list[str] | None = None
        self._unfiltered_stream: IterableDataset | None = None  # see without_retired_prompts
        streaming = isinstance(host.train_dataset, IterableDataset)
        # Sampling state (saved in checkpoints): retired prompts, the extra-prompt stream, the sampler's epoch.
        self.prompt_state = PromptState(
            args.seed,
            lambda: len(host.train_dataset),
            self.dataset_prompt_keys,
            row_at=lambda index: host.train_dataset[index],
            open_stream=self._open_stream_pass if streaming else None,
            key=lambda row: prompt_key(row.get("prompt")),
        )
        self.callback = PromptSamplingCallback(
            self.prompt_state,
            lambda: self.prompt_state.prompts_left((self.prompt_state.epoch or 0) + 1),
            retiring=args.positive_resampling_threshold is not None,
        )

    # -------------------------------------------------------------------------------------------------- the batch
    def generation_batch(self, inputs: list[dict], mode: str) -> dict:
        """What one generation step trains on (or evaluates), for this process's ``inputs`` rows."""
        host = self.host
        if mode == "eval":
            scored = self.score_round(inputs, mode)
            output = scored.rows
            self.finalize(output, scored.rewards, None, mode, self.local_rows(output["advantages"].shape[0]))
            return output
        local_size = len(inputs)

        def score_round(index: int, num_groups: int) -> SampledRound:
            round_inputs = inputs if index == 0 else self.extra_round_inputs(num_groups, template=inputs[0])
            scored = self.score_round(round_inputs, mode)
            self.retire_passing_prompts(round_inputs, scored.task_rewards)
            return scored

        target = local_size * host.accelerator.num_processes // host.num_generations
        plan = sample_groups(
            self.group_selection, score_round, target, host.args.max_num_gen_batches, self.extra_round_sizer(target)
        )
        self.log_sampling_metrics(plan)
        if plan.regroup:
            output = self.regrouped_batch(plan, local_size)
        else:
            output = plan.rounds[0].rows
            self.finalize(output, plan.rounds[0].rewards, plan.active, mode, self.local_rows(local_size))
        rounds = tuple((r.informative.numel(), int(r.informative.sum())) for r in plan.rounds)
        self.last_batch = dataclasses.replace(self.last_batch, generation_rounds=rounds)
        return output

    def score_round(self, inputs: list[dict], mode: str) -> SampledRound:
        """TRL's generation and scoring of ``inputs`` (local rows), then the reward shaping. Returns TRL's output as
        ``rows`` and, for the gathered batch, the shaped rewards, the task rewards (before shaping), their informative
        groups and the completion tokens generated (the gathered completion lengths)."""
        host = self.host
        output, rewards_per_func, lengths = host.trl_round(inputs)
        host.check_context_length(output)
        # TRL logged its advantages for the completions table; finalize logs the ones this trainer trains on.
        logged = host._logs["advantages"]
        for _ in range(min(len(logged), rewards_per_func.shape[0])):
            logged.pop()
        task_rewards = self.combined_rewards(rewards_per_func, self.task_reward_columns)
        host._metrics[mode]["task_reward"].append(torch.nanmean(task_rewards).nan_to_num(0.0).item())
        group_size = host.num_generations if mode == "train" else host.num_generations_eval
        rewards = self.shaped_rewards(
            self.combined_rewards(rewards_per_func, group_size=group_size), rewards_per_func, lengths, output, mode
        )
        if host._uses_topk_divergence:
            output.update(host.rollout_topk(output, mode))
        informative = informative_groups(task_rewards, group_size)
        return SampledRound(output, rewards, informative, task_rewards, completion_tokens=int(lengths.sum().item()))

    def local_rows(self, local_size: int) -> slice:
        start = self.host.accelerator.process_index * local_size
        return slice(start, start + local_size)

    def finalize(
        self, output: dict, rewards, active_groups, mode: str, local_rows: slice, log_advantages: bool = True
    ) -> torch.Tensor:
        """Advantages and loss weights of the gathered batch, fixed on its active groups (all groups when
        ``active_groups`` is ``None``); the rows of this process go into ``output``. Returns the gathered
        advantages."""
        host, args = self.host, self.host.args
        num_generations = host.num_generations if mode == "train" else host.num_generations_eval
        loss_mask = loss_tokens(output)
        token_counts = host.accelerator.gather(loss_mask.sum(dim=1).float())
        token_inputs = self.token_inputs(output, loss_mask, mode)
        advantages, weights, active_rows = batch_advantages_and_weights(
            rewards,
            token_counts,
            num_generations,
            args.advantage_estimator,
            args.loss_aggregation,
            args.max_completion_length,
            active_groups,
            normalize_advantages=args.normalize_advantages,
            **token_inputs,
            # the estimator's own fields (MaxRL's maxrl_reward_threshold), as its registration declares them
            **ADVANTAGE_ESTIMATORS.config_kwargs(args.advantage_estimator, args),
        )
        if active_rows is not None:
            output["row_active"] = active_rows[local_rows].to(loss_mask.dtype)
        # token-level advantages were padded to the longest completion of all processes: this process's width back
        output["advantages"] = (
            advantages[local_rows] if advantages.dim() == 1 else advantages[local_rows, : loss_mask.shape[1]]
        )
        output["loss_weights"] = weights[local_rows]
        if mode == "train":
            self.last_batch = TrainBatch(
                rewards.detach().clone(),
                advantages.detach().clone(),
                None if active_groups is None else active_groups.detach().clone(),
                output["loss_weights"].detach().clone(),
            )
        self.log_advantages(advantages, token_inputs.get("completion_mask"), mode, log_advantages)
        return advantages

    def token_inputs(self, output: dict, loss_mask: torch.Tensor, mode: str) -> dict[str, Any]:
        """What a token-level estimator (REINFORCE++'s) reads beside the rewards, for the gathered batch: each row's
        counted tokens (``completion_mask``) and, with ``beta != 0``, the k1 KL of each token between ``π_old`` and
        TRL's reference (``token_kl``, logged as ``kl``), padded to the longest completion of all processes; and
        ``beta``. Empty for the other estimators."""
        host = self.host
        if not ADVANTAGE_ESTIMATORS.traits(host.args.advantage_estimator).token_level:
            return {}
        accelerator = host.accelerator

        def gathered(value: torch.Tensor) -> torch.Tensor:
            return accelerator.gather(accelerator.pad_across_processes(value, dim=1, pad_index=0))

        mask = gathered(loss_mask.float())
        inputs: dict[str, Any] = {"completion_mask": mask, "beta": host.beta}
        if host.beta != 0.0 and ADVANTAGE_ESTIMATORS.traits(host.args.advantage_estimator).kl_in_return:
            kl = token_kl(self.old_logps(output), output["ref_per_token_logps"], loss_mask)
            inputs["token_kl"] = gathered(kl.float())
            host._metrics[mode]["kl"].append(((inputs["token_kl"] * mask).sum() / mask.sum().clamp(min=1)).item())
        return inputs

    def log_advantages(self, advantages: torch.Tensor, mask: torch.Tensor | None, mode: str, table: bool) -> None:
        """The completions table gets one advantage per completion (``per_completion``: a token-level estimator's
        first token, the normalised return of the whole completion); ``advantages/mean`` and ``advantages/abs_mean``
        average the batch's completions, or, for token-level advantages, its counted tokens (padding left out)."""
        host = self.host
        if table:
            host._logs["advantages"].extend(per_completion(advantages).tolist())
        values = advantages if advantages.dim() == 1 else advantages[mask.bool()]
        host._metrics[mode]["advantages/mean"].append(values.mean().item() if values.numel() else 0.0)
        host._metrics[mode]["advantages/abs_mean"].append(values.abs().mean().item() if values.numel() else 0.0)

    def old_logps(self, output: dict) -> torch.Tensor:
        """``π_old``'s log-probabilities of the sampled tokens: TRL's, or, where TRL skipped them (on-policy), a
        no-grad forward of the policy now, kept in ``output`` so that the loss's ratio takes the same ``π_old``."""
        old = output.get("old_per_token_logps")
        if old is None:
            with torch.no_grad():
                old = self.host.behaviour_logps(output)
            output["old_per_token_logps"] = old
        return old

    # -------------------------------------------------------------------------------------------------- rewards
    def combined_rewards(
        self, rewards_per_func: torch.Tensor, columns: torch.Tensor | None = None, group_size: int | None = None
    ) -> torch.Tensor:
        """The reward of each completion: the weighted sum of the ``columns`` reward functions (the task reward), or,
        without ``columns``, TRL's ``multi_objective_aggregation`` of all of them over groups of ``group_size``."""
        weights = self.host.reward_weights
        if columns is None and self.host.args.multi_objective_aggregation == "normalize_then_sum":
            return normalize_then_sum_rewards(rewards_per_func, weights, group_size)
        return combined_rewards(rewards_per_func, weights, columns)

    def shaped_rewards(self, combined, rewards_per_func, lengths, output: dict, mode: str) -> torch.Tensor:
        """The ``combined`` reward with the configured shaping: TRL RLOO's clipping, the MaxRL binary check, DAPO's
        overlong penalty, RLOO's KL penalty. (REINFORCE++'s per-token KL is not reward shaping: its estimator reads it
        when the batch is final, ``token_inputs``; ``π_old`` for it is computed here, with the round.)"""
        host, args = self.host, self.host.args
        metrics = host._metrics[mode]
        rewards = clip_rewards(combined.clone(), args.reward_clip_range)
        estimator = args.advantage_estimator
        # an estimator that needs 0/1 rewards, unless its own reward_threshold field binarizes them
        binarized = ADVANTAGE_ESTIMATORS.config_kwargs(estimator, args).get("reward_threshold") is not None
        if ADVANTAGE_ESTIMATORS.traits(estimator).binary_rewards and not binarized:
            check_binary_rewards(rewards_per_func, combined, host.reward_func_names, host.reward_weights, estimator)
        if args.overlong_cache_length is not None:
            penalty = overlong_penalty(lengths, args.max_completion_length, args.overlong_cache_length)
            rewards = rewards + penalty.to(rewards.dtype)
            metrics["overlong/penalty_mean"].append(penalty.mean().item())
            metrics["overlong/frac_penalized"].append((penalty < 0).float().mean().item())
        if host.beta != 0.0 and ADVANTAGE_ESTIMATORS.traits(estimator).kl_in_return:
            self.old_logps(output)  # pi_old of the per-token KL, computed now so that it travels with every row
        if args.kl_in_reward and host.beta != 0.0:
            old, counted = self.old_logps(output), loss_tokens(output)  # the model's own tokens: no tool output
            kl = host.accelerator.gather(sequence_kl(old, output["ref_per_token_logps"], counted))
            rewards = rewards - host.beta * kl
            tokens = host.accelerator.gather(counted.sum(dim=1).float()).sum().clamp(min=1)
            metrics["kl"].append((kl.sum() / tokens).item())
        metrics["reward_shaped/mean"].append(torch.nanmean(rewards).item())
        return rewards

    # -------------------------------------------------------------------------------------------------- dynamic sampling
    def regrouped_batch(self, plan: GroupPlan, local_size: int) -> dict[str, torch.Tensor]:
        """The batch of the groups ``plan`` chose from several rounds: every round's rows gathered from all processes,
        the chosen ones stacked, and this process's slice kept (all processes hold the same plan)."""
        from trl.trainer.utils import unsplit_pixel_values_by_grid

        host = self.host
        processes = host.accelerator.num_processes
        rows = [self.gather_rows(r.rows, r.rewards.numel() // processes) for r in plan.rounds]
        for r in plan.rounds:  # placeholders in the completions table, set below for the last round
            host._logs["advantages"].extend([0.0] * r.rewards.numel())
        row_sources = plan.row_sources(host.num_generations)
        batch = stack_rows(rows, row_sources, host._tokenizer.pad_token_id)
        rewards = torch.stack([plan.rounds[r].rewards[i] for r, i in row_sources])
        if plan.cap_hit:
            informative = int(plan.informative.sum())
            warnings.warn(
                f"Dynamic sampling found {informative} informative groups (rewards not all equal) in "
                f"max_num_gen_batches={host.args.max_num_gen_batches} generation rounds, fewer than the "
                f"{len(plan.chosen)} this batch needs. The step trains on those; the missing groups are fillers with "
                "loss weight 0. Raise max_num_gen_batches, or check that the reward can tell completions apart.",
                DynamicSamplingWarning,
                stacklevel=user_stacklevel(),
            )
        local_rows = self.local_rows(local_size)
        output = unsplit_pixel_values_by_grid(join_spanning({key: value[local_rows] for key, value in batch.items()}))
        output["num_items_in_batch"] = host.accelerator.gather(loss_tokens(output).sum()).sum()
        advantages = self.finalize(output, rewards, plan.active, "train", local_rows, log_advantages=False)
        # The completions table keeps the last round's rows (its deques hold one batch): log what each of them
        # trains with, 0 for the groups that were dropped.
        last_round = len(plan.rounds) - 1
        logged_values = [0.0] * plan.rounds[last_round].rewards.numel()
        for position, (round_index, row) in enumerate(row_sources):
            if round_index == last_round:
                logged_values[row] = per_completion(advantages)[position].item()
        logged = host._logs["advantages"]
        for _ in range(min(len(logged), len(logged_values))):
            logged.pop()
        logged.extend(logged_values)
        return output

    def gather_rows(self, output: dict, local_size: int) -> dict[str, torch.Tensor | list]:
        """Every row of a TRL output, gathered from all processes: per-row tensors padded to a common length; a
        multimodal row's image tensors (TRL's ``split_pixel_values_by_grid``: its patches, grids, image count) as a
        list, one entry per row; token-type ids cut into their prompt and completion parts (``split_spanning``)."""
        from trl.trainer.utils import split_pixel_values_by_grid

        accelerator, pad_token_id = self.host.accelerator, self.host._tokenizer.pad_token_id
        per_row = split_pixel_values_by_grid(
            {key: value for key, value in output.items() if key != "num_items_in_batch"}
        )
        per_row = split_spanning(per_row, output["prompt_ids"].shape[1])
        rows = {}
        for key, value in per_row.items():
            if isinstance(value, list) and len(value) == local_size:
                rows[key] = self.gather_list(value)
                continue
            if not (isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == local_size):
                raise ValueError(
                    f"dynamic_sampling cannot regroup the generation output {key!r}, which is not one entry per row "
                    f"({type(value).__name__}). Set dynamic_sampling=False."
                )
            if value.dim() >= 2:
                value = accelerator.pad_across_processes(
                    value, dim=1, pad_index=pad_value(key, pad_token_id), pad_first=left_padded(key)
                )
            rows[key] = accelerator.gather(value)
        return rows

    def gather_list(self, values: list) -> list:
        """A per-row list from every process, in process order (tensors travel through the CPU and come back to
        this process's device)."""
        accelerator = self.host.accelerator
        if accelerator.num_processes == 1:
            return list(values)
        gathered = gather_object([value.cpu() if isinstance(value, torch.Tensor) else value for value in values])
        return [value.to(accelerator.device) if isinstance(value, torch.Tensor) else value for value in gathered]

    def extra_round_sizer(self, full_round: int):
        """``sample_groups``' sizer of extra rounds: from the keep rate measured so far in the step, or a full batch
        each round with ``extra_round_size="full"``; 0 (no more rounds) once every prompt is retired."""
        host = self.host

        def next_round_groups(rounds: list[SampledRound]) -> int:
            if host.args.extra_round_size == "full":
                groups = full_round
            else:
                kept = sum(int(r.informative.sum()) for r in rounds)
                generated = sum(r.informative.numel() for r in rounds)
                processes = host.accelerator.num_processes
                groups = extra_round_groups(kept, generated, full_round, full_round, processes, host.num_generations)
            return groups if self.prompt_state.extra_prompts().has_prompts(groups) else 0

        return next_round_groups

    def extra_round_inputs(self, num_prompts: int, template: dict) -> list[dict]:
        """This process's rows of a fresh generation round of ``num_prompts`` prompts (from the seeded stream of
        indices, or from the streaming dataset itself), each repeated ``num_generations`` times, laid out across
        processes as TRL's sampler does. Repeats are copies, as TRL's own repeats are (TRL writes into its rows)."""
        host = self.host
        prompts = self.prompt_state.extra_rows(num_prompts)
        columns = set(template)
        rows = [{key: value for key, value in row.items() if key in columns} for row in prompts]
        repeated = [row for row in rows for _ in range(host.num_generations)]
        local = repeated[self.local_rows(len(repeated) // host.accelerator.num_processes)]
        return [copy.deepcopy(row) for row in local]

    def without_retired_prompts(self, stream: IterableDataset) -> IterableDataset:
        """A streaming training set has no sampler to leave retired prompts out: its rows are filtered as they are read,
        by the epoch in which each prompt was retired (from the next epoch on, as the map-style sampler does). Extra
        prompts keep reading ``stream`` itself (they skip retired prompts on their own), so their position in it does
        not depend on the filter's epoch."""
        self._unfiltered_stream = stream
        return stream.filter(lambda row: not self.prompt_state.excluded_now(prompt_key(row.get("prompt"))))

    def _open_stream_pass(self, pass_index: int, skip: int):
        """An iterator over pass ``pass_index`` of the streaming training set for dynamic sampling's extra prompts,
        after its first ``skip`` rows: reshuffled per pass (a seed apart from the dataloader's) when TRL shuffles."""
        host = self.host
        dataset = self._unfiltered_stream if self._unfiltered_stream is not None else host.train_dataset
        if host.shuffle_dataset:
            dataset = dataset.shuffle(seed=host.args.seed + 7919 * (pass_index + 1))
        if skip:
            dataset = dataset.skip(skip)
        return iter(dataset)

    # -------------------------------------------------------------------------------------------------- retirement
    def dataset_prompt_keys(self) -> list[str]:
        dataset = self.host.train_dataset
        if self._prompt_keys is None:
            if "prompt" not in dataset.column_names:
                raise ValueError(
                    "positive_resampling_threshold identifies prompts by the training dataset's 'prompt' column, "
                    "which it does not have."
                )
            self._prompt_keys = [prompt_key(prompt) for prompt in dataset["prompt"]]
        return self._prompt_keys

    def retire_passing_prompts(self, inputs: list[dict], task_rewards: torch.Tensor) -> None:
        """ScaleRL's no-positive-resampling: retire the prompts whose group pass rate reached the threshold."""
        host = self.host
        threshold = host.args.positive_resampling_threshold
        if threshold is None:
            return
        if self.retirement_off:
            host._metrics["train"]["group_selection/retirement_suspended"].append(1.0)
            return
        pass_threshold = host.args.task_pass_threshold
        if pass_threshold is None and not is_correctness_reward(task_rewards):
            self._suspend_retirement(task_rewards)  # for the rest of the run: a pass stays undefined
            return
        keys = gather_object([prompt_key(row.get("prompt")) for row in inputs])
        rates = group_pass_rates(task_rewards, host.num_generations, pass_threshold)
        epoch = self.prompt_state.epoch if self.prompt_state.epoch is not None else int(host.state.epoch or 0)
        for group, rate in enumerate(rates.tolist()):
            if rate >= threshold:
                self.prompt_state.retired.retire(keys[group * host.num_generations], epoch)

    def _suspend_retirement(self, task_rewards: torch.Tensor) -> None:
        """A task reward that is not a correctness reward has no pass without ``task_pass_threshold``: from here on
        retire nothing (as TRL, which never retires), say so once, and count the batches in a metric."""
        host = self.host
        host._metrics["train"]["group_selection/retirement_suspended"].append(1.0)
        self.retirement_off = True
        scored = task_rewards[~torch.isnan(task_rewards)]
        example = scored[
            ~torch.isin(scored, torch.tensor([-1.0, 0.0, 1.0], dtype=scored.dtype, device=scored.device))
        ][:1].tolist()
        names = [n for n, on in zip(host.reward_func_names, self.task_reward_columns.tolist(), strict=True) if on]
        warnings.warn(
            f"No-positive-resampling (positive_resampling_threshold={host.args.positive_resampling_threshold}) "
            f"retires a prompt when enough of its completions pass, and without task_pass_threshold a pass is a "
            f"task reward > 0, which only a correctness reward (values in -1, 0, 1) defines. The task reward "
            f"({', '.join(names)}) returned {example[0] if example else 'other values'}, so no prompt is retired from "
            f"now on ({len(self.prompt_state.retired)} were before; training goes on over every other prompt, as in TRL). Set task_pass_threshold (e.g. 1.0 for a score in [0, 1] "
            "where 1 is a full pass) to retire prompts, or positive_resampling_threshold=None to silence this.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    def log_sampling_metrics(self, plan: GroupPlan) -> None:
        host = self.host
        metrics = host._metrics["train"]
        if plan.regroup:  # a strategy that may generate more rounds
            metrics["group_selection/generation_rounds"].append(float(len(plan.rounds)))
            metrics["group_selection/round_cap_hit"].append(float(plan.cap_hit))
        if plan.active is not None:  # a strategy that made a selection
            metrics["group_selection/groups_generated"].append(float(plan.informative.numel()))
            metrics["group_selection/groups_kept"].append(float(plan.active.sum()))
            # What the step's selection cost: completion tokens generated, over all rounds, per group that trains.
            tokens = float(sum(r.completion_tokens or 0 for r in plan.rounds))
            metrics["group_selection/generated_tokens"].append(tokens)
            metrics["group_selection/tokens_per_trained_group"].append(tokens / max(float(plan.active.sum()), 1.0))
            # TRL's `reward` and this trainer's `task_reward` average every generated completion; this is the task
            # reward of the completions that train.
            rows = plan.row_sources(host.num_generations)
            trained = plan.active.repeat_interleave(host.num_generations).tolist()
            values = [plan.rounds[r].task_rewards[i] for (r, i), keep in zip(rows, trained, strict=True) if keep]
            mean = torch.nanmean(torch.stack(values)).item() if values else float("nan")
            metrics["group_selection/task_reward_trained"].append(mean)
        if host.args.positive_resampling_threshold is not None:
            metrics["group_selection/retired_prompts"].append(float(len(self.prompt_state.retired)))

    # -------------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The sampling state a checkpoint keeps (see ``algorithms.prompt_sampling.PromptState``)."""
        return self.prompt_state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        return self.prompt_state.load_state_dict(state)

    def save(self, folder: str | os.PathLike) -> None:
        """The sampling state into ``folder`` (a checkpoint), written atomically."""
        write_json_atomically(os.path.join(folder, SAMPLING_STATE_FILE), self.state_dict())

    def restore(self, checkpoint: str | os.PathLike) -> None:
        """Load ``checkpoint``'s sampling state; a damaged file is a ``SamplingStateError`` naming it, a missing one
        (a checkpoint copied by hand, or written by TRL's own trainer) a warning when this run has state to lose; what
        a changed dataset made re-derived, a warning each."""
        path = os.path.join(checkpoint, SAMPLING_STATE_FILE)
        state = read_sampling_state(checkpoint)
        if state is None:
            losing = [
                what
                for what, on in (
                    (
                        "the prompts no-positive-resampling retired",
                        self.host.args.positive_resampling_threshold is not None,
                    ),
                    ("dynamic sampling's extra-prompt stream", self.generates_extra_rounds),
                    ("the prompt sampler's epoch", self.host.accelerator.num_processes > 1),
                )
                if on
            ]
            if losing:
                warnings.warn(
                    f"{path} is missing, so this resume starts without {' and '.join(losing)} (they restart as in a "
                    "new run). If the checkpoint was copied, copy that file with it to resume exactly.",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            return
        for note in self.load_state_dict(state):
            warnings.warn(f"{path}: {note}.", UserWarning, stacklevel=user_stacklevel())
