"""Environments (TRL's ``environment_factory``) for batches a generator samples ahead (``async_generator="process"``
or ``"server"``).

TRL starts each rollout's episode when it scores the batch: it draws one instance per row from its pool, calls
``reset(**row)`` and appends the observation to the row's last prompt message, then samples the first turn. A batch
sampled ahead has its first turn sampled ``k`` steps before TRL scores it, so its episodes must start then:
:class:`AheadEpisodes` resets one instance per row when the batch is submitted (the prompts then carry the
observations, and each prompt is rendered with its own environment's tools, as TRL renders it), keeps those
instances with the batch, and lends them to TRL when it scores the batch. TRL's own draw then hands each row the
instance that was reset for it, and TRL's ``reset`` call on it returns the kept observation instead of starting the
episode again, so the tools the model calls act on the episode its first turn saw, and ``get_reward`` reads it.

Each of the ``k + 1`` batches in flight has its own instances; an instance goes back to a free list, to be reset for
a later batch, once its batch is scored (TRL's "construct once, reset often").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .protocols import AsyncRolloutHost


def prompt_with_observation(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """``prompt`` with a ``reset()`` observation appended to its last message's content, as TRL's scoring appends it
    (no separator; text and content blocks converted to each other), or ``prompt`` itself when it returned ``None``.
    The row's own messages are left untouched."""
    if observation is None:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**prompt[-1], "content": content + observation}]


class _KeptObservation:
    """An instance's ``reset`` for TRL's one call when it scores the batch: returns the observation of the reset made
    at submission, and gives the instance its own ``reset`` back."""

    def __init__(self, instance: Any, observation: Any):
        self._instance, self._observation = instance, observation

    def __call__(self, **row: Any) -> Any:
        self._instance.__dict__.pop("reset", None)
        return self._observation


@dataclass
class BatchEpisodes:
    """The episodes of one submitted batch: each row's environment name (``None`` with one environment), the instance
    reset for it, and what that ``reset`` returned."""

    names: list[Any]
    instances: list[Any]
    observations: list[Any]


class AheadEpisodes:
    """Prepares each batch a generator samples ahead: its prompts as TRL would pass them to ``_generate`` and their
    token ids, with episodes started at submission where the run has environments (:meth:`prepare`); lends a batch's
    instances to TRL's scoring of it (:meth:`lent_to_trl`)."""

    def __init__(self, host: AsyncRolloutHost):
        self.host = host
        self._by_step: dict[int, BatchEpisodes] = {}
        self._free: dict[Any, list[Any]] = {}  # instances whose batch was scored, by environment name

    @property
    def active(self) -> bool:
        """Whether the run has environments (``environment_factory``)."""
        return self.host.environment_factories is not None

    def prepare(self, step: int, rows: list[dict[str, Any]]) -> tuple[list, list[list[int]]]:
        """The prompts of the batch of generation ``step`` (this process's ``rows``) as TRL's ``_generate`` receives
        them, and their token ids. With environments, each row's episode starts here: an instance per row is reset
        with the row (its ``environment`` field picks it among several) and its observation is appended to the
        prompt, which is rendered with that environment's tools."""
        host = self.host
        if not self.active:
            prompts = [row["prompt"] for row in rows]
            return prompts, host.tokenize_prompts(prompts)
        multi = host._multi_environment
        names = [row.get("environment") if multi else None for row in rows]
        for name in dict.fromkeys(names):
            if name not in host.environment_factories:
                raise ValueError(
                    f"Example has `environment={name!r}`, which is not among the environments passed to "
                    f"`environment_factory`. Expected one of: {list(host.environment_factories)}."
                )
        instances = [self._instance(name) for name in names]
        observations, prompts = [], []
        for row, instance in zip(rows, instances, strict=True):
            observation = instance.reset(**({k: v for k, v in row.items() if k != "environment"} if multi else row))
            observations.append(observation)
            prompts.append(prompt_with_observation(row.get("prompt", [{"role": "user", "content": ""}]), observation))
        self._by_step[step] = BatchEpisodes(names, instances, observations)
        had, saved = hasattr(host, "_batch_environments"), getattr(host, "_batch_environments", None)
        host._batch_environments = names  # TRL renders each prompt with its own environment's tools
        try:
            return prompts, host.tokenize_prompts(prompts)
        finally:
            if had:
                host._batch_environments = saved
            else:  # TRL sets it only when it scores a batch: leave none behind, as before the call
                del host._batch_environments

    def _instance(self, name: Any) -> Any:
        free = self._free.get(name)
        instance = free.pop() if free else self.host.environment_factories[name]()
        if not hasattr(instance, "__dict__"):
            raise TypeError(
                f"{type(instance).__name__} instances have no __dict__ (__slots__), so the episode their reset() starts "
                "when a batch is submitted cannot be handed to TRL's scoring of it: give the class a __dict__, or use "
                "async_generator='inline'."
            )
        return instance

    @contextlib.contextmanager
    def lent_to_trl(self, step: int) -> Iterator[None]:
        """Around TRL's scoring of the batch of generation ``step``: TRL's pool holds the batch's instances in row
        order, so its draw gives each row the instance reset for it at submission, and each instance's next ``reset``
        returns that reset's observation. Afterwards TRL's own pool is back and the instances are free."""
        episodes = self._by_step.pop(step, None)
        if episodes is None:
            yield
            return
        host = self.host
        pool: dict[Any, list[Any]] = {}
        for name, instance, observation in zip(episodes.names, episodes.instances, episodes.observations, strict=True):
            pool.setdefault(name, []).append(instance)
            instance.reset = _KeptObservation(instance, observation)
        saved = host._environment_pool
        host._environment_pool = pool
        try:
            yield
        finally:
            host._environment_pool = saved
            for instance in episodes.instances:
                vars(instance).pop("reset", None)
            self._release(episodes)

    def forget(self) -> None:
        """Drop the episodes of batches that will not be scored (the pipeline closed); their instances are free."""
        for episodes in self._by_step.values():
            self._release(episodes)
        self._by_step.clear()

    def _release(self, episodes: BatchEpisodes) -> None:
        """Put a batch's instances on the free list, to be reset for a later batch."""
        for name, instance in zip(episodes.names, episodes.instances, strict=True):
            self._free.setdefault(name, []).append(instance)
