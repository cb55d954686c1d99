"""Which prompts get sampled, and the state a checkpoint keeps of it: ScaleRL's no-positive-resampling memory
(:class:`RetiredPrompts`), the resumable training sampler (:class:`EpochRepeatSampler`), DAPO's stream of extra
prompts for dynamic sampling (:class:`PromptStream`, or :class:`StreamedPrompts` over a streaming dataset) and
:class:`PromptState`, which holds them and writes and reads the checkpoint's sampling state (no TRL import).

Which generated groups train is :mod:`trl_reasoning.algorithms.group_selection`. Sources: DAPO, arXiv 2503.14476
(dynamic sampling); ScaleRL, arXiv 2510.13786 (no-positive-resampling).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from ..utils.user_warnings import user_stacklevel

#: The version of the sampling state's layout :meth:`PromptState.state_dict` writes (as ``"format"``); a file without
#: it is read as version 0 (before 0.2).
SAMPLING_STATE_FORMAT = 1


def prompt_key(prompt: Any) -> str:
    """A stable identifier of a prompt (text or chat messages): the SHA-1 of its canonical JSON, 16 hex digits."""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


class RetiredPrompts:
    """ScaleRL's no-positive-resampling memory: prompt key -> the epoch in which its pass rate reached the threshold.

    A prompt retired in epoch ``e`` is excluded from the samplers from epoch ``e + 1`` on, so an epoch's order depends
    only on what was retired before it started (which keeps resumed runs identical to uninterrupted ones).
    """

    def __init__(self) -> None:
        self.epoch_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.epoch_of)

    def __contains__(self, key: str) -> bool:
        return key in self.epoch_of

    def retire(self, key: str, epoch: int) -> bool:
        """Retire ``key`` in ``epoch``; returns whether it was newly retired."""
        if key in self.epoch_of:
            return False
        self.epoch_of[key] = int(epoch)
        return True

    def excluded_before(self, epoch: int) -> set[str]:
        """The keys retired in an epoch before ``epoch``."""
        return {key for key, retired_in in self.epoch_of.items() if retired_in < epoch}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_of": dict(self.epoch_of)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch_of = {str(key): int(epoch) for key, epoch in state["epoch_of"].items()}


def eligible_indices(keys: Sequence[str] | None, excluded: set[str], num_samples: int) -> list[int]:
    """Indices ``0..num_samples-1`` whose prompt key is not in ``excluded`` (all of them when nothing is excluded)."""
    if not excluded:
        return list(range(num_samples))
    if keys is None:
        raise ValueError("Prompt keys are needed to exclude retired prompts.")
    return [i for i in range(num_samples) if keys[i] not in excluded]


class EpochRepeatSampler(Sampler[int]):
    """TRL's ``RepeatSampler`` layout (each prompt ``mini_repeat_count`` times in a row, chunks of ``batch_size``
    prompts repeated ``repeat_count`` times) with two changes that make checkpoints resumable and prompts retirable:

    - the order of epoch ``e`` is a function of ``(seed, e)`` alone, set by ``set_epoch`` (which the HF Trainer calls
      at every epoch start, including the one it resumes in), instead of a generator that advances with every epoch;
      epoch 0 is the same permutation ``RepeatSampler`` draws with that seed;
    - prompts that ``retired`` excludes for the epoch are skipped, and the epoch is refilled from a further
      permutation of the remaining prompts, so every epoch has the same number of batches (the Trainer's step
      accounting, learning-rate schedule and resume arithmetic rely on that length).
    """

    def __init__(
        self,
        num_samples: int,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        retired: RetiredPrompts | None = None,
        prompt_keys: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        if num_samples < batch_size:
            raise ValueError(
                f"The training dataset has {num_samples} prompts, fewer than the {batch_size} unique prompts one "
                "generation batch needs (generation_batch_size / num_generations)."
            )
        self.num_samples = num_samples
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.seed = seed
        self.retired = retired
        self.prompt_keys = prompt_keys
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def epoch_order(self) -> list[int]:
        """The prompt indices of the current epoch, one per prompt, before the repeats."""
        needed = (self.num_samples // self.batch_size) * self.batch_size
        excluded = self.retired.excluded_before(self.epoch) if self.retired is not None else set()
        keys = self.prompt_keys() if excluded and self.prompt_keys is not None else None
        eligible = eligible_indices(keys, excluded, self.num_samples)
        if not eligible:
            # Normally the trainer stops at the end of the epoch that retired the last prompt; this is a run resumed
            # after that point. An empty epoch ends training (the Trainer stops when an epoch yields no batch).
            warnings.warn(
                f"Every one of the {self.num_samples} training prompts has been retired by no-positive-resampling "
                f"(positive_resampling_threshold) before epoch {self.epoch}: there is nothing left to sample, so "
                "training ends here.",
                UserWarning,
                stacklevel=user_stacklevel(),  # the sampler runs under the DataLoader: name the user's train() line
            )
            return []
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order: list[int] = []
        while len(order) < needed:
            if self.shuffle:
                order.extend(eligible[i] for i in torch.randperm(len(eligible), generator=generator).tolist())
            else:
                order.extend(eligible)
        return order[:needed]

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count


class PromptStream:
    """A seeded, resumable stream of dataset indices for the extra prompts of dynamic sampling.

    Each pass is a permutation of the prompts not retired when the pass begins (seeded by ``seed`` and the pass
    number); ``take(n)`` hands out the next ``n`` indices, starting a new pass when one runs out. Its whole state
    (pass number and the rest of the current pass) goes into checkpoints.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        retired: RetiredPrompts | None = None,
        prompt_keys: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        if num_samples < 1:
            raise ValueError("Dynamic sampling needs a non-empty training dataset.")
        self.num_samples = num_samples
        self.seed = seed
        self.retired = retired
        self.prompt_keys = prompt_keys
        self.passes = 0
        self.remaining: list[int] = []

    def _eligible(self) -> list[int]:
        excluded = set(self.retired.epoch_of) if self.retired is not None else set()
        keys = self.prompt_keys() if excluded and self.prompt_keys is not None else None
        return eligible_indices(keys, excluded, self.num_samples)

    def _new_pass(self) -> None:
        eligible = self._eligible()
        generator = torch.Generator()
        generator.manual_seed(self.seed + 7919 * (self.passes + 1))  # streams of different passes do not overlap
        self.remaining = [eligible[i] for i in torch.randperm(len(eligible), generator=generator).tolist()]
        self.passes += 1

    def has_prompts(self, count: int = 1) -> bool:
        """Whether :meth:`take` can hand out ``count`` prompts: this pass has them left, or a new pass has a prompt
        that is not retired (when every prompt is retired, dynamic sampling stops generating extra rounds)."""
        return len(self.remaining) >= count or bool(self._eligible())

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices (over as many passes as needed). Raises a ``RuntimeError`` when every prompt is
        retired (ask :meth:`has_prompts` first)."""
        taken: list[int] = []
        while len(taken) < count:
            if not self.remaining:
                self._new_pass()
                if not self.remaining:
                    raise RuntimeError("Every training prompt has been retired: the extra-prompt stream is empty.")
            step = min(count - len(taken), len(self.remaining))
            taken.extend(self.remaining[:step])
            self.remaining = self.remaining[step:]
        return taken

    def state_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "remaining": list(self.remaining)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.passes = int(state["passes"])
        self.remaining = [int(i) for i in state["remaining"]]


class StreamedPrompts:
    """Dynamic sampling's extra prompts from a streaming dataset itself, as verl draws its next batch: a pass over the
    stream (reshuffled per pass with a seed of its own), rows whose prompt is retired skipped, a new pass when one
    ends. Its state is the pass number and the rows read in that pass up to the last row handed out, so a resumed run
    skips exactly those.

    ``open_pass(pass_index, skip)`` returns an iterator over the rows of pass ``pass_index`` (0, 1, ...) after its
    first ``skip`` rows; ``key(row)`` identifies a row's prompt for retirement."""

    def __init__(
        self,
        open_pass: Callable[[int, int], Iterator[dict]],
        key: Callable[[dict], str],
        retired: RetiredPrompts | None = None,
    ) -> None:
        self.open_pass = open_pass
        self.key = key
        self.retired = retired
        # Saved state: passes started up to the last row handed out, rows of that pass read up to it.
        self.passes = 0
        self.position = 0
        # The reader, which may be ahead of the saved state (rows read by has_prompts, not handed out yet).
        self._rows: Iterator[dict] | None = None
        self._pass = 0  # passes the reader has started
        self._read = 0  # rows it has read in its pass
        self._ahead: list[tuple[int, int, dict]] = []  # (pass, rows read up to it, row)
        self._eligible_in_pass = False
        self._resume = False  # a restored state: reopen the saved pass at `position` before reading on

    def _open(self, pass_number: int, skip: int) -> None:
        self._pass = pass_number
        self._rows = self.open_pass(pass_number - 1, skip)
        self._read = skip
        # a pass resumed part-way had eligible rows before (they were handed out); a new pass has none yet
        self._eligible_in_pass = skip > 0

    def _read_ahead(self, count: int) -> bool:
        """Read rows until ``count`` eligible ones wait; ``False`` when a whole pass has none (every prompt retired,
        or an empty stream)."""
        if self._resume:
            self._resume = False
            self._open(self.passes, self.position)
        while len(self._ahead) < count:
            if self._rows is None:
                self._open(self._pass + 1, 0)
            try:
                row = next(self._rows)
            except StopIteration:
                self._rows = None
                if not self._eligible_in_pass:
                    return False
                continue
            self._read += 1
            if self.retired is not None and self.key(row) in self.retired:
                continue
            self._eligible_in_pass = True
            self._ahead.append((self._pass, self._read, row))
        return True

    def has_prompts(self, count: int = 1) -> bool:
        """Whether :meth:`take_rows` can hand out ``count`` prompts (reads them ahead)."""
        return self._read_ahead(count)

    def take_rows(self, count: int) -> list[dict]:
        """The next ``count`` rows whose prompt is not retired. Raises a ``RuntimeError`` when none is left."""
        if not self._read_ahead(count):
            raise RuntimeError(
                "Every prompt of the training stream has been retired: the extra-prompt stream is empty."
            )
        taken, self._ahead = self._ahead[:count], self._ahead[count:]
        self.passes, self.position = taken[-1][0], taken[-1][1]
        return [row for _, _, row in taken]

    def state_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "position": self.position, "streamed": True}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.passes, self.position = int(state["passes"]), int(state["position"])
        self._rows, self._ahead, self._pass = None, [], self.passes
        self._resume = self.passes > 0


class PromptState:
    """The prompt-sampling state of a run, in one place, as a checkpoint keeps it: ScaleRL's retired prompts, DAPO's
    stream of extra prompts (made on first use) and the training sampler with its epoch.

    ``dataset_size``, ``prompt_keys`` and ``row_at`` are callables so that nothing is read from the dataset before it
    is needed (prompt keys hash every prompt). A streaming dataset gives ``open_stream`` (see :class:`StreamedPrompts`)
    and ``key`` instead: it has no length and no index, and its epoch is counted by the trainer (``stream_epoch``)."""

    def __init__(
        self,
        seed: int,
        dataset_size: Callable[[], int],
        prompt_keys: Callable[[], Sequence[str]],
        row_at: Callable[[int], dict] | None = None,
        open_stream: Callable[[int, int], Iterator[dict]] | None = None,
        key: Callable[[dict], str] | None = None,
    ) -> None:
        self.seed = seed
        self.dataset_size = dataset_size
        self.prompt_keys = prompt_keys
        self.row_at = row_at
        self.open_stream = open_stream
        self.key = key
        self.retired = RetiredPrompts()
        self.stream: PromptStream | StreamedPrompts | None = None
        self.sampler: EpochRepeatSampler | None = None
        self.stream_epoch = 0

    @property
    def streaming(self) -> bool:
        return self.open_stream is not None

    def extra_prompts(self) -> PromptStream | StreamedPrompts:
        """The stream of prompts for dynamic sampling's extra rounds."""
        if self.stream is None:
            if self.streaming:
                self.stream = StreamedPrompts(self.open_stream, self.key, self.retired)
            else:
                self.stream = PromptStream(self.dataset_size(), self.seed, self.retired, self.prompt_keys)
        return self.stream

    def extra_rows(self, count: int) -> list[dict]:
        """The rows of the next ``count`` extra prompts."""
        source = self.extra_prompts()
        if isinstance(source, StreamedPrompts):
            return source.take_rows(count)
        return [self.row_at(index) for index in source.take(count)]

    def new_sampler(
        self, num_samples: int, mini_repeat_count: int, batch_size: int, repeat_count: int, shuffle: bool
    ) -> EpochRepeatSampler:
        """A training sampler that skips the retired prompts; it becomes the one whose epoch is saved."""
        self.sampler = EpochRepeatSampler(
            num_samples=num_samples,
            mini_repeat_count=mini_repeat_count,
            batch_size=batch_size,
            repeat_count=repeat_count,
            shuffle=shuffle,
            seed=self.seed,
            retired=self.retired,
            prompt_keys=self.prompt_keys,
        )
        return self.sampler

    def prompts_left(self, epoch: int) -> bool:
        """Whether any training prompt is still drawn in ``epoch`` (none is once no-positive-resampling has retired
        every prompt in an earlier epoch)."""
        excluded = self.retired.excluded_before(epoch)
        if not excluded:
            return True
        return bool(eligible_indices(self.prompt_keys(), excluded, self.dataset_size()))

    @property
    def epoch(self) -> int | None:
        """The training sampler's epoch (``None`` before there is a sampler); a stream's epoch as the trainer counts
        them."""
        if self.streaming:
            return self.stream_epoch
        return None if self.sampler is None else self.sampler.epoch

    def excluded_now(self, key: str) -> bool:
        """Whether a streamed prompt is left out of the current epoch: retired in an earlier one."""
        retired_in = self.retired.epoch_of.get(key)
        return retired_in is not None and retired_in < self.stream_epoch

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": SAMPLING_STATE_FORMAT,
            "retired_prompts": self.retired.state_dict(),
            "prompt_stream": None if self.stream is None else self.stream.state_dict(),
            "sampler_epoch": self.epoch,
            "num_samples": self.stream.num_samples if isinstance(self.stream, PromptStream) else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore a saved state; returns what had to be re-derived because the dataset given now differs from the
        one the state was saved with (empty when nothing did).

        Retired prompts are keyed by content, so they stay valid whatever the dataset (keys not in it are never drawn).
        The extra-prompt stream holds dataset indices: when the dataset's size changed, or an index is out of range,
        it restarts with a fresh pass over the dataset given now (TRL's own sampler does the same on a resume with
        another dataset: it simply samples the new one)."""
        notes = []
        self.retired.load_state_dict(state["retired_prompts"])
        saved_stream = state.get("prompt_stream")
        if saved_stream is not None and bool(saved_stream.get("streamed")) != self.streaming:
            notes.append(
                "the checkpoint's extra-prompt stream was drawn from a "
                + ("map-style" if self.streaming else "streaming")
                + " dataset and this run's is not: the stream restarts with a new pass over the dataset given now"
            )
        elif saved_stream is not None and self.streaming:
            self.extra_prompts().load_state_dict(saved_stream)
        elif saved_stream is not None:
            size = self.dataset_size()
            saved_size = state.get("num_samples")
            out_of_range = [i for i in saved_stream.get("remaining", []) if not 0 <= int(i) < size]
            if (saved_size is not None and saved_size != size) or out_of_range:
                was = f"{saved_size} prompts" if saved_size is not None else f"indices up to {max(out_of_range)}"
                notes.append(
                    f"the training dataset has {size} prompts, the checkpoint's extra-prompt stream was drawn from "
                    f"{was}: the stream restarts with a new pass over the dataset given now"
                )
                self.stream = None
                self.extra_prompts().passes = int(saved_stream.get("passes", 0))
            else:
                self.extra_prompts().load_state_dict(saved_stream)
        # The Trainer sets the epoch of a resumed epoch through the dataloader, but with several processes accelerate
        # wraps the sampler of a resumed (batch-skipping) dataloader one level deeper than the Trainer reaches, and the
        # sampler would replay epoch 0's order. The checkpoint's own epoch is restored here instead.
        if state.get("sampler_epoch") is not None and self.sampler is not None:
            self.sampler.set_epoch(state["sampler_epoch"])
        if state.get("sampler_epoch") is not None and self.streaming:  # the pass the stream filter was reading
            self.stream_epoch = int(state["sampler_epoch"])
        return notes
