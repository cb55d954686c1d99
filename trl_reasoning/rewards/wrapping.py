"""Reward shaping and reward-function wrapping.

``overlong_penalty`` is DAPO's soft overlong punishment. ``wrap_reward_function`` makes a reward function's failure
name the function; ``check_reward_columns`` reports a function whose outputs for a whole batch are unusable.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import threading
from collections.abc import Callable, Sequence

import torch

logger = logging.getLogger(__name__)


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned unusable values; the message names the function."""


def overlong_penalty(
    completion_lengths: torch.Tensor, max_completion_length: int, overlong_cache_length: int
) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13), added to the task reward.

    With ``L_max = max_completion_length``, ``L_c = overlong_cache_length`` and ``|y|`` in tokens::

        0                               if |y| <= L_max - L_c
        ((L_max - L_c) - |y|) / L_c     if L_max - L_c < |y| <= L_max
        -1                              if |y| > L_max
    """
    if not 0 < overlong_cache_length <= max_completion_length:
        raise ValueError(
            f"overlong_cache_length must be in (0, max_completion_length={max_completion_length}], "
            f"got {overlong_cache_length}."
        )
    lengths = completion_lengths.to(torch.float32)
    expected = max_completion_length - overlong_cache_length
    ramp = (expected - lengths) / overlong_cache_length
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_completion_length, torch.full_like(lengths, -1.0), penalty)


def binarize_rewards(rewards: torch.Tensor, threshold: float) -> torch.Tensor:
    """``1.0`` where ``reward >= threshold``, else ``0.0``; ``NaN`` (unscorable) stays ``NaN``."""
    return torch.where(torch.isnan(rewards), rewards, (rewards >= threshold).to(rewards.dtype))


def non_binary_reward_functions(rewards_per_func: torch.Tensor, names: Sequence[str]) -> list[tuple[str, float]]:
    """The reward functions (with one offending value each) whose non-``NaN`` outputs are not all 0 or 1."""
    offenders = []
    for column, name in zip(rewards_per_func.unbind(dim=1), names, strict=True):
        values = column[~torch.isnan(column)]
        bad = values[(values != 0) & (values != 1)]
        if bad.numel():
            offenders.append((name, bad[0].item()))
    return offenders


#: Why a wrapped reward function's last call gave none of its completions a reward, by function name, when it is not
#: the function's own ``None``: under ``on_reward_error="exclude"`` the call timed out, or was skipped because an
#: earlier call is still running past ``reward_timeout``. Set by the wrapper, cleared by its next call that returns
#: rewards, and read (then cleared) by :func:`check_reward_columns`, which the trainer calls right after the batch's
#: reward calls, so that its warning says what happened instead of "returned None or NaN".
_UNSCORED_CALLS: dict[str, str] = {}


def check_reward_columns(rewards_per_func: torch.Tensor, names: Sequence[str]) -> None:
    """Report by name a reward function whose outputs for the whole batch are unusable.

    ``rewards_per_func`` is ``(N, n_funcs)``, gathered over processes, ``NaN`` where a function returned ``None``.
    Raises :class:`RewardFunctionError` if a function returned ``inf`` (TRL would turn it into NaN advantages and a NaN
    loss). A function that returns ``None``/``NaN`` for every completion is legal, as in TRL (a verifier that cannot
    parse any answer yet; multi-task routing): it is logged as a warning naming it, and completions no function
    scored are unscorable (advantage 0), so such a batch trains nothing. A function that gave no reward because its
    call timed out, or was skipped while an earlier call is still running past ``reward_timeout``, is reported as
    such (``on_reward_error="exclude"``).
    """
    for column, name in zip(rewards_per_func.unbind(dim=1), names, strict=True):
        reason = _UNSCORED_CALLS.pop(name, None)
        if torch.isinf(column).any():
            index = int(torch.isinf(column).nonzero()[0])
            raise RewardFunctionError(
                f"Reward function '{name}' returned {column[index].item()} for completion {index} of the batch; "
                "rewards must be finite (return None to mark a completion as not scorable)."
            )
        if torch.isnan(column).all():
            others = " Other reward functions still score the batch." if len(names) > 1 else ""
            what = (
                f"returned None or NaN for all {column.numel()} completions of the batch."
                if reason is None
                else f"{reason}: none of the {column.numel()} completions of the batch got its reward (counted in "
                f"rewards/{name}/errors)."
            )
            logger.warning(
                f"Reward function '{name}' {what}"
                + (others or " Those completions are unscorable (advantage 0): this batch trains nothing.")
            )
    if len(names) > 1 and rewards_per_func.numel() and torch.isnan(rewards_per_func).all():
        logger.warning(
            f"No reward function ({', '.join(names)}) scored any completion of the batch (see the warnings above): "
            "it trains nothing."
        )


#: What a wrapped reward function does when it raises: ``"raise"`` an error naming it and the failing sample, or
#: ``"exclude"`` the failing samples (their reward becomes ``None``, i.e. unscorable) and count them.
REWARD_ERROR_POLICIES = ("raise", "exclude")


def _one_sample(kwargs: dict, index: int, size: int) -> dict:
    """The keyword arguments of a batched reward call restricted to sample ``index`` (per-sample lists sliced)."""
    return {
        key: [value[index]] if isinstance(value, (list, tuple)) and len(value) == size else value
        for key, value in kwargs.items()
    }


def _describe_sample(kwargs: dict, index: int) -> str:
    prompt = kwargs.get("prompts", [None] * (index + 1))[index]
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    text = repr(prompt)
    return f"sample {index} (prompt {text[:80] + '...' if len(text) > 80 else text})"


class RewardTimeoutError(RewardFunctionError):
    """A reward function did not return within ``reward_timeout`` seconds."""


class _StillRunningError(RewardTimeoutError):
    """A sync reward function was not called because its earlier call is still running past ``reward_timeout``."""


class _StuckCall:
    """The one call of a sync reward function that timed out and is still running in its helper thread.

    A thread cannot be stopped, so a function that hangs would leave one more thread behind at every call; instead,
    while its timed-out call is still running the function is not called again (the call is skipped), so
    each reward function holds at most one stuck thread. When that call returns at last, the function is used again.
    """

    def __init__(self, name: str):
        self.name = name
        self.running: threading.Event | None = None  # set when the timed-out call returns; None when none timed out
        self.warned = False

    def blocks(self) -> bool:
        """Whether a timed-out call of the function is still running (and the function must not be called)."""
        if self.running is None:
            return False
        if self.running.is_set():
            logger.info(f"Reward function '{self.name}': its timed-out call returned; it is called again.")
            self.running, self.warned = None, False
            return False
        if not self.warned:
            self.warned = True
            logger.warning(
                f"Reward function '{self.name}' is not called while its call that passed reward_timeout is still "
                "running (a thread cannot be stopped, so one stuck call per function is the most kept): each call "
                f"is skipped (on_reward_error='exclude': no reward, counted in rewards/{self.name}/errors) until "
                "that call returns."
            )
        return True


def _call_in_thread(
    func: Callable, args: tuple, kwargs: dict, timeout: float, name: str, stuck: _StuckCall | None = None
):
    """``func(*args, **kwargs)`` in a daemon thread, waited on for ``timeout`` seconds. A call that has not returned by
    then raises :class:`RewardTimeoutError`; its thread cannot be stopped and is left running in the background, and
    recorded in ``stuck`` (if given), so that the function is not called again until it returns."""
    if stuck is not None and stuck.blocks():
        raise _StillRunningError(
            f"Reward function '{name}' was skipped because its previous call is still running past reward_timeout="
            f"{timeout} s (a thread cannot be stopped; the function is called again once that call returns)"
        )
    outcome: dict = {}
    finished = threading.Event()

    def target():
        try:
            outcome["value"] = func(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed back to the calling thread
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=target, name=f"reward-{name}", daemon=True).start()
    if not finished.wait(timeout):
        if stuck is not None:
            stuck.running = finished
        raise RewardTimeoutError(f"Reward function '{name}' did not return within reward_timeout={timeout} s")
    error = outcome.get("error")
    if isinstance(error, ValueError) and "signal only works in main thread" in str(error):
        # A setting, not a sample's fault: raised whatever on_reward_error says (it would exclude every sample).
        raise RewardFunctionError(
            f"Reward function '{name}' sets a signal (e.g. math_verify's own parsing timeout, SIGALRM), which works only "
            f"in the main thread, and reward_timeout={timeout} runs it in a helper thread. Set reward_timeout=None, or "
            "turn the function's own signal timeout off (math_verify: parse(..., parsing_timeout=None) and "
            "verify(..., timeout_seconds=None))."
        ) from error
    if error is not None:
        raise error
    return outcome["value"]


def _check_shape(output, name: str) -> None:
    """Raise naming ``name`` when ``output`` is a tensor or array whose shape TRL cannot take as one reward per
    completion. TRL reads a tensor row by row and converts each row with ``torch.tensor``, which takes a one-element
    tensor as its number: so a 1-D tensor, and a ``(n, 1)`` one (a reward model's score head) or ``(n, 1, 1)``, pass.
    A numpy array's rows stay arrays there, so only a 1-D array passes."""
    shape = getattr(output, "shape", None)
    if shape is None:
        return
    shape = tuple(shape)
    if torch.is_tensor(output):
        fits = len(shape) >= 1 and math.prod(shape[1:]) == 1
        kind, takes = "a tensor", "a 1-D tensor, an (n, 1) tensor (a reward model's score head) or a list"
    else:
        fits = len(shape) == 1
        kind, takes = f"an array ({type(output).__name__})", "a 1-D array (reshape(-1) an (n, 1) one) or a list"
    if not fits:
        raise RewardFunctionError(
            f"Reward function '{name}' returned {kind} of shape {shape}; it must return one reward per completion: "
            f"{takes}."
        )


def _check_rewards(output, kwargs: dict, name: str):
    """The rewards of ``name``, accepted exactly when TRL's conversion accepts them (``None`` -> NaN, then
    ``torch.tensor(rewards, dtype=float32)`` into one column): numbers of any numeric type, bools, numpy scalars,
    one-element torch tensors, ``None``; returned as a list, tuple, 1-D numpy array, a tensor with one value per
    completion (1-D, or ``(n, 1)`` as a reward model's score head) or any other iterable (a one-shot iterable is
    returned as the list it was read into)."""
    expected = len(kwargs["completions"]) if "completions" in kwargs else None
    if output is None or isinstance(output, (str, bytes, dict)) or not hasattr(output, "__iter__"):
        raise RewardFunctionError(
            f"Reward function '{name}' returned {type(output).__name__}; it must return a list with one float "
            "(or None) per completion."
        )
    _check_shape(output, name)
    values = list(output.detach()) if torch.is_tensor(output) else list(output)
    if not hasattr(output, "__len__"):
        output = values  # a generator or another one-shot iterable is consumed here; TRL gets the list
    if expected is not None and len(values) != expected:
        raise RewardFunctionError(
            f"Reward function '{name}' returned {len(values)} rewards for {expected} completions; it must "
            "return exactly one reward (or None) per completion."
        )
    _check_reward_values(values, name)
    return output


def _check_reward_values(values: list, name: str) -> None:
    """Raise naming the first reward that TRL's ``torch.tensor(rewards, dtype=float32)`` could not take."""
    try:
        converted = torch.tensor([torch.nan if v is None else v for v in values], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        converted = None
    if converted is not None and converted.dim() == 1:
        return
    for index, value in enumerate(values):
        try:
            ok = value is None or torch.tensor([value], dtype=torch.float32).shape == (1,)
        except (TypeError, ValueError, RuntimeError):
            ok = False
        if not ok:
            raise RewardFunctionError(
                f"Reward function '{name}' returned {value!r} ({type(value).__name__}) for completion {index}; "
                "rewards must be numbers (int, float, bool, numpy scalars, one-element torch tensors) or None."
            )


def _batch_size(kwargs: dict) -> int | None:
    """The number of completions of a reward call, or ``None`` when it was not given ``completions``."""
    completions = kwargs.get("completions")
    return len(completions) if completions is not None else None


class _RewardCallPolicy:
    """What a wrapped reward function does around each call of ``func``: the timeout, the checks of its output,
    the sample-by-sample retry of a failed batch and the ``on_error`` policy. The sync and async wrappers share it;
    the counters it adds to (``error_count``, ``retried_count``) live on the wrapper, where the trainer reads and
    resets them."""

    def __init__(self, func: Callable, name: str, on_error: str, timeout: float | None):
        self.func, self.name, self.on_error, self.timeout = func, name, on_error, timeout
        self.stuck = _StuckCall(name)
        self.wrapper: Callable | None = None  # set once the wrapper exists

    def call(self, *args, **kwargs):
        """One sync call of ``func``, in a helper thread waited on for ``timeout`` seconds when one is set."""
        if self.timeout is None:
            return self.func(*args, **kwargs)
        return _call_in_thread(self.func, args, kwargs, self.timeout, self.name, self.stuck)

    async def call_async(self, *args, **kwargs):
        """One async call of ``func``, cancelled after ``timeout`` seconds when one is set."""
        if self.timeout is None:
            return await self.func(*args, **kwargs)
        try:
            return await asyncio.wait_for(self.func(*args, **kwargs), self.timeout)
        except asyncio.TimeoutError:
            raise RewardTimeoutError(
                f"Reward function '{self.name}' did not return within reward_timeout={self.timeout} s"
            ) from None

    def check(self, output, kwargs: dict):
        """The batch's rewards, checked as TRL will convert them."""
        _UNSCORED_CALLS.pop(self.name, None)
        return _check_rewards(output, kwargs, self.name)

    def failure(self, error: Exception, kwargs: dict, index: int | None) -> RewardFunctionError:
        """The error naming the function, the failing sample (if known) and what it raised."""
        where = f" on {_describe_sample(kwargs, index)}" if index is not None else ""
        return RewardFunctionError(f"Reward function '{self.name}' raised {type(error).__name__}{where}: {error}")

    def single_value(self, output):
        """The one reward of a call on one sample."""
        if output is None or isinstance(output, (str, bytes, dict)) or not hasattr(output, "__iter__"):
            raise RewardFunctionError(f"Reward function '{self.name}' did not return one reward for one completion.")
        output = list(output)
        if len(output) != 1:
            raise RewardFunctionError(f"Reward function '{self.name}' did not return one reward for one completion.")
        return output[0]

    def resolve(self, batch_error: Exception, kwargs: dict, results: list) -> list:
        """Per-sample outcomes (a value or an exception) -> the batch's rewards, or the error to raise.

        With ``"raise"`` the retries stop at the first failing sample (a judge is not paid for the rest), so a
        failure is the last entry of ``results``. With ``"exclude"``, samples that succeed when retried keep their
        value and only the failing ones are excluded; if every retry succeeds (a transient batch error), the batch
        gets the retried values."""
        failures = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
        if self.on_error == "raise":
            if failures:
                index, error = failures[0]
                raise self.failure(error, kwargs, index) from error
            # every sample passes alone: the batch call itself is at fault
            raise self.failure(batch_error, kwargs, None) from batch_error
        self.wrapper.error_count += len(failures)
        self.wrapper.retried_count += len(results) - len(failures)
        return [None if isinstance(r, Exception) else r for r in results]

    def retries(self, kwargs: dict, batch_error: Exception):
        """The sample-by-sample retry of a failed batch, shared by the sync and async wrappers: a generator that
        yields each sample's keyword arguments, is sent back that call's outcome (its one reward, or the exception),
        and returns the batch's rewards (or raises, per ``on_error``)."""
        size = _batch_size(kwargs)
        if size is None:
            raise self.failure(batch_error, kwargs, None) from batch_error
        results = []
        for index in range(size):
            outcome = yield _one_sample(kwargs, index, size)
            results.append(outcome)
            if isinstance(outcome, Exception) and self.on_error == "raise":
                break
        return self.resolve(batch_error, kwargs, results)

    def timed_out(self, error: RewardTimeoutError, kwargs: dict) -> list:
        """A call past ``timeout`` (or skipped while an earlier one still runs past it): the error under
        ``"raise"``; under ``"exclude"`` no reward for any of its samples, and why recorded for
        :func:`check_reward_columns`."""
        size = _batch_size(kwargs)
        if self.on_error == "raise" or size is None:
            raise RewardTimeoutError(
                f"{error} on a call with {size if size is not None else 'its'} completions; raise reward_timeout, "
                "or set on_reward_error='exclude' to train on without those rewards."
            ) from None
        self.wrapper.error_count += size
        _UNSCORED_CALLS[self.name] = (
            f"was skipped because its previous call is still running past reward_timeout={self.timeout} s (it is "
            "called again once that call returns)"
            if isinstance(error, _StillRunningError)
            else f"did not return within reward_timeout={self.timeout} s"
        )
        return [None] * size


def _sync_reward_wrapper(policy: _RewardCallPolicy) -> Callable:
    """The wrapper of a sync reward function: one batch call, then sample by sample if it raised."""

    @functools.wraps(policy.func)
    def sync_wrapper(*args, **kwargs):
        try:
            return policy.check(policy.call(*args, **kwargs), kwargs)
        except RewardTimeoutError as error:
            return policy.timed_out(error, kwargs)
        except RewardFunctionError:
            raise
        except Exception as error:  # noqa: BLE001 - located sample by sample, then re-raised or excluded
            retry = policy.retries(kwargs, error)
            try:
                sample_kwargs = next(retry)
                while True:
                    try:
                        outcome = policy.single_value(policy.call(*args, **sample_kwargs))
                    except Exception as sample_error:  # noqa: BLE001
                        outcome = sample_error
                    sample_kwargs = retry.send(outcome)
            except StopIteration as done:
                return policy.check(done.value, kwargs)

    return sync_wrapper


def _async_reward_wrapper(policy: _RewardCallPolicy) -> Callable:
    """The wrapper of an async reward function (still a coroutine function, so TRL runs it concurrently)."""

    @functools.wraps(policy.func)
    async def async_wrapper(*args, **kwargs):
        try:
            return policy.check(await policy.call_async(*args, **kwargs), kwargs)
        except RewardTimeoutError as error:
            return policy.timed_out(error, kwargs)
        except RewardFunctionError:
            raise
        except Exception as error:  # noqa: BLE001 - located sample by sample, then re-raised or excluded
            retry = policy.retries(kwargs, error)
            try:
                sample_kwargs = next(retry)
                while True:
                    try:
                        outcome = policy.single_value(await policy.call_async(*args, **sample_kwargs))
                    except Exception as sample_error:  # noqa: BLE001
                        outcome = sample_error
                    sample_kwargs = retry.send(outcome)
            except StopIteration as done:
                return policy.check(done.value, kwargs)

    return async_wrapper


def wrap_reward_function(func: Callable, name: str, on_error: str = "raise", timeout: float | None = None) -> Callable:
    """Wrap ``func`` so that its failures name it, and optionally exclude the samples it fails on.

    When ``func`` raises on a batch, it is called again sample by sample to find the failing samples. With
    ``on_error="raise"`` a :class:`RewardFunctionError` names the function, the first failing sample and the error.
    With ``on_error="exclude"`` every failing sample gets ``None`` (unscorable: advantage 0, like TRL's ``None``) and
    the count is added to ``wrapper.error_count`` (the trainer logs it as ``rewards/<name>/errors``); samples that
    succeed when called again keep their value (counted in ``wrapper.retried_count``). With ``on_error="raise"`` the
    sample-by-sample calls stop at the first failure, so a costly reward (an LLM judge) is not called more than
    needed.

    With ``timeout`` (seconds, the config's ``reward_timeout``) a call that has not returned by then counts as an
    error: under ``"raise"`` a :class:`RewardTimeoutError` naming the function; under ``"exclude"`` every sample of
    the call gets ``None`` without sample-by-sample retries (each could cost a timeout), counted in ``error_count``.
    A sync function runs in a helper thread for that; a thread cannot be stopped, so while a call that timed out is
    still running the function is not called again (each of its calls is skipped and counts as an error, with one
    warning naming it): at most one stuck thread per function, and the function is used again once that call returns. An async one
    runs under ``asyncio.wait_for``, which cancels it.

    The wrapper keeps ``__name__`` (TRL logs rewards under it) and stays a coroutine function when ``func`` is one,
    so TRL still runs async reward functions concurrently. It also checks the number and type of returned rewards.
    """
    if on_error not in REWARD_ERROR_POLICIES:
        raise ValueError(f"Unknown on_reward_error {on_error!r}. Allowed values: {', '.join(REWARD_ERROR_POLICIES)}.")
    policy = _RewardCallPolicy(func, name, on_error, timeout)
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
    wrapper = (_async_reward_wrapper if is_async else _sync_reward_wrapper)(policy)
    policy.wrapper = wrapper
    wrapper.__name__ = name
    wrapper.__wrapped_reward_function__ = func
    wrapper.error_count = 0
    wrapper.retried_count = 0
    return wrapper
