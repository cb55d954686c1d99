"""The trainer's callback on epochs for prompt sampling (:class:`PromptSamplingCallback`), which every trl-reasoning
trainer adds through its rollout (``trainer/rollout.py``): it counts a stream's epochs and ends training cleanly once
no-positive-resampling has retired every prompt. The sampling state itself is
:class:`trl_reasoning.algorithms.prompt_sampling.PromptState`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from transformers import TrainerCallback
from transformers.trainer_utils import SaveStrategy


class PromptSamplingCallback(TrainerCallback):
    """The trainer's own hooks on epochs for prompt sampling (added by every trl-reasoning trainer):

    - counts the epochs of a streaming training set (``prompt_state.stream_epoch``: the epoch whose rows the stream
      filter is reading; a stream has no sampler to carry it);
    - ends training cleanly at the end of the epoch in which no-positive-resampling retired the last prompt: a warning,
      then the Trainer's normal end (a final checkpoint when saving by steps, as when ``max_steps`` is reached; the
      script's ``save_model`` runs as usual), instead of an epoch with nothing to sample. For a map-style dataset
      ``prompts_left_next()`` tells it beforehand; a stream shows it by an epoch without a single step.
    """

    def __init__(self, prompt_state, prompts_left_next: Callable[[], bool] | None, retiring: bool):
        self.prompt_state = prompt_state
        self.prompts_left_next = prompts_left_next
        self.retiring = retiring
        self.stopped_at: int | None = None
        self._epochs_begun = 0
        self._step_at_epoch_begin = 0
        self._resumed_epoch = False

    def on_train_begin(self, args, state, control, **kwargs):
        # A stream's epochs go on from a resumed checkpoint's (the Trainer's own loop over a stream restarts at 0).
        self._epochs_begun = self.prompt_state.stream_epoch if state.global_step > 0 else 0
        # The Trainer resumes a stream by skipping the batches of the steps it has trained, from the stream's start: a
        # shorter stream is used up by that skip, so the first epoch of a resume may train no step at all.
        self._resumed_epoch = state.global_step > 0

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.prompt_state.streaming:
            self.prompt_state.stream_epoch = self._epochs_begun
        self._epochs_begun += 1
        self._step_at_epoch_begin = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.retiring or state.global_step >= state.max_steps:
            return control
        if self.prompt_state.streaming:
            skipped_through, self._resumed_epoch = self._resumed_epoch, False
            exhausted = (
                state.global_step == self._step_at_epoch_begin
                and len(self.prompt_state.retired) > 0
                and not skipped_through
            )
        else:
            exhausted = not self.prompts_left_next()
        if not exhausted:
            return control
        warnings.warn(
            f"No-positive-resampling has retired every training prompt (their pass rate reached "
            f"positive_resampling_threshold={args.positive_resampling_threshold}; {len(self.prompt_state.retired)} "
            f"retired): training ends at step {state.global_step} of {state.max_steps}, as at a normal end"
            + (", with a final checkpoint." if args.save_strategy == SaveStrategy.STEPS else ".")
            + " Use more prompts or a higher threshold to train longer.",
            UserWarning,
            stacklevel=2,
        )
        self.stopped_at = state.global_step
        control.should_training_stop = True
        if args.save_strategy == SaveStrategy.STEPS:
            control.should_save = True
        return control
