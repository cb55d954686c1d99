"""Tool calls that fail, hang or answer at length, in TRL's multi-turn loop (``tools=[...]``, ``environment_factory``).

TRL 1.16 runs each tool the model calls on the training thread and, when the call raises, gives the model
``{"error": "..."}`` as the tool's response and counts the call in ``tools/failure_frequency``. Three things it leaves
to the user are handled here, per call:

- **a failure is reported by name**: the first failure of each tool is a warning naming the tool and its error (the
  failure frequency alone does not say which tool fails or why); later ones are counted in ``tools/failures/<name>``;
- **a hanging call ends** after ``tool_call_timeout`` seconds: it fails as a raising call fails (the model reads
  ``{"error": "tool 'name' did not answer within N s"}``, the turn goes on as TRL goes on after an error). A Python
  thread cannot be stopped, so a sync tool runs on a daemon thread of its own, which is left to finish (or not)
  without holding up training; an async tool is cancelled;
- **a long response is cut** to ``max_tool_response_tokens`` tokens (with a note of how many were dropped), so one
  tool's output cannot fill ``max_completion_length`` by itself.

:class:`ToolCallGuard` wraps the callables of TRL's per-rollout tool tables (``_sync_tool_dicts``,
``_async_tool_dicts``), which TRL rebuilds for every batch, before TRL's loop calls them; the tables keep their keys,
so TRL finds each tool by the name it was registered under.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ..utils.user_warnings import user_stacklevel


class ToolCallTimeout(TimeoutError):
    """A tool call that did not answer within ``tool_call_timeout`` seconds."""


class ToolCallGuard:
    """Wraps the tools of each batch (:meth:`guard`): a failure warned once per tool name and counted, a call past
    ``timeout`` seconds failed, a response longer than ``max_response_tokens`` tokens of ``tokenizer`` cut."""

    def __init__(self, timeout: float | None, max_response_tokens: int | None, tokenizer: Any):
        self.timeout = timeout
        self.max_response_tokens = max_response_tokens
        self.tokenizer = tokenizer
        self.failures: Counter[str] = Counter()  # by tool name, since the last :meth:`take_failures`
        self.failed_names: set[str] = set()  # every tool that failed at least once (warned once each)

    def guard(self, sync_tables: list[dict] | None, async_tables: list[dict] | None) -> None:
        """Wrap every callable of TRL's per-rollout tables in place (a table wrapped before is left as it is)."""
        for tables, wrap in ((sync_tables, self._wrap_sync), (async_tables, self._wrap_async)):
            for table in tables or []:
                for name, tool in table.items():
                    if not getattr(tool, "_trl_reasoning_guarded", False):
                        table[name] = wrap(name, tool)

    def take_failures(self) -> dict[str, int]:
        """The failures counted by tool name since the last call, then forgotten (logged once a generation batch)."""
        failures, self.failures = dict(self.failures), Counter()
        return failures

    # ------------------------------------------------------------------------------------------------- wrapping
    def _wrap_sync(self, name: str, tool: Callable) -> Callable:
        @functools.wraps(tool)
        def guarded(**arguments):
            try:
                result = self._call_with_timeout(name, tool, arguments)
            except Exception as error:
                self._failed(name, error)
                raise
            return self._shortened(name, result)

        guarded._trl_reasoning_guarded = True
        return guarded

    def _wrap_async(self, name: str, tool: Callable) -> Callable:
        @functools.wraps(tool)
        async def guarded(**arguments):
            try:
                if self.timeout is None:
                    result = await tool(**arguments)
                else:
                    try:
                        result = await asyncio.wait_for(tool(**arguments), self.timeout)
                    except asyncio.TimeoutError:
                        raise ToolCallTimeout(self._timeout_message(name)) from None
            except Exception as error:
                self._failed(name, error)
                raise
            return self._shortened(name, result)

        guarded._trl_reasoning_guarded = True
        return guarded

    def _call_with_timeout(self, name: str, tool: Callable, arguments: dict) -> Any:
        """``tool(**arguments)``; with a timeout, on a daemon thread waited for at most ``timeout`` seconds."""
        if self.timeout is None:
            return tool(**arguments)
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["result"] = tool(**arguments)
            except BaseException as error:  # handed to the training thread, which raises it there
                outcome["error"] = error

        worker = threading.Thread(target=call, name=f"trl-reasoning-tool-{name}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            raise ToolCallTimeout(self._timeout_message(name))
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def _timeout_message(self, name: str) -> str:
        return f"tool {name!r} did not answer within {self.timeout:g} s (tool_call_timeout)"

    def _failed(self, name: str, error: BaseException) -> None:
        self.failures[name] += 1
        if name in self.failed_names:
            return
        self.failed_names.add(name)
        warnings.warn(
            f"Tool {name!r} failed: {type(error).__name__}: {error}. As in TRL, the model reads "
            "{\"error\": ...} as the tool's response and the call counts in tools/failure_frequency; this tool's "
            f"later failures are counted in tools/failures/{name} without another warning.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    def _shortened(self, name: str, result: Any) -> Any:
        """A text response cut to ``max_response_tokens`` tokens (other responses, such as TRL's multimodal lists,
        are left as they are)."""
        if self.max_response_tokens is None or isinstance(result, list):
            return result
        text = str(result)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.max_response_tokens:
            return result
        kept = self.tokenizer.decode(ids[: self.max_response_tokens])
        return f"{kept} [... {len(ids) - self.max_response_tokens} more tokens of {name}'s response cut]"


@contextlib.contextmanager
def tool_calls_guarded(host: Any) -> Iterator[None]:
    """Around TRL's ``_generate`` of trainer ``host``: the batch's tool tables wrapped by the trainer's
    :class:`ToolCallGuard` (made at first use from ``host.args``), and each tool that ever failed logged with its
    failures in this batch on this process, ``tools/failures/<name>``. Nothing without tools."""
    if not getattr(host, "tools", None):
        yield
        return
    guard = host.__dict__.get("tool_call_guard")
    if guard is None:
        args = getattr(host, "args", None)  # TRL's tests call _generate on a trainer built without __init__
        guard = ToolCallGuard(
            getattr(args, "tool_call_timeout", None), getattr(args, "max_tool_response_tokens", None), host._tokenizer
        )
        host.tool_call_guard = guard
    # TRL_TOOL_TABLES (checked against TRL's source by check_trl_private_api)
    guard.guard(getattr(host, "_sync_tool_dicts", None), getattr(host, "_async_tool_dicts", None))
    try:
        yield
    finally:
        failures = guard.take_failures()
        metrics = host._metrics["train" if host.model.training else "eval"]
        for name in sorted(guard.failed_names):
            metrics[f"tools/failures/{name}"].append(float(failures.get(name, 0)))
