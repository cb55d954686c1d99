"""The tasks ``--task NAME`` chooses on the command line, each declared by its own module.

A task module registers a :class:`CliTask`: its name, its one-line help, its default reward (a name of the CLI's
``--reward_funcs``) and how its dataset is built: generated rows (``build``: an object with ``rl_rows(split)``), or a
dataset to load when ``--dataset_name`` is unset (``dataset``), and a row formatting applied to whatever is loaded
(``format_row``). The command line asks :data:`TASKS` and never compares task names, so adding a task is one
registration in its module (and the module's import in ``trl_reasoning/tasks/__init__.py``).

A task whose model calls tools (``tool_multiply``) also names its tools, the chat template that renders them, and a
preparation of the model given on the command line (a cached warm start) before RL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CliTask:
    """A task of ``--task``.

    Attributes:
        name: the value of ``--task`` (``"gsm8k"``).
        help: what it is, in a few words, for ``--help`` (``"math answers"``).
        reward: the name of its default reward function in ``--reward_funcs`` (``"math_answer_reward"``).
        build: builds the task object whose ``rl_rows("train")`` and ``rl_rows("test")`` are the dataset's splits when
            ``--dataset_name`` is unset; ``None`` for a task that loads its dataset.
        dataset: ``(dataset_name, dataset_config)`` loaded when ``--dataset_name`` is unset (a Hub id).
        format_row: ``dataset.map`` function applied to a loaded dataset (the task's own or ``--dataset_name``'s).
        warm_start: without ``--model_name_or_path``, training starts from the tiny model warm-started on ``build()``.
        tools: the tools the trainer gets (``tools=``, as ``trl.GRPOTrainer`` takes them); empty for a task without.
        chat_template: the chat template set on the tokenizer before training (one that renders ``tools``), or a
            function returning it (so that a task module need not import TRL when the command line starts); ``None``
            keeps the model's own.
        prepare_model: called with the resolved ``--model_name_or_path`` before training, returns the model to train
            (e.g. the folder of a cached warm start of it); ``None`` trains the given model.
    """

    name: str
    help: str
    reward: str
    build: Callable[[], Any] | None = None
    dataset: tuple[str, str | None] | None = None
    format_row: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    warm_start: bool = False
    tools: tuple[Callable, ...] = ()
    chat_template: str | Callable[[], str] | None = None
    prepare_model: Callable[[str], str] | None = None

    def template(self) -> str | None:
        """The chat template to set on the tokenizer (``chat_template`` called when it is a function), or ``None``."""
        return self.chat_template() if callable(self.chat_template) else self.chat_template


class TaskRegistry:
    """The tasks of ``--task``, listed in alphabetical order (whatever order their modules were imported in)."""

    def __init__(self) -> None:
        self._tasks: dict[str, CliTask] = {}

    def register(self, task: CliTask) -> CliTask:
        """Add ``task``; a name can be registered once."""
        if task.name in self._tasks:
            raise ValueError(f"task {task.name!r} is already registered")
        self._tasks[task.name] = task
        return task

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a task registered for a test); an unknown name raises."""
        self.get(name)
        del self._tasks[name]

    def get(self, name: str, option: str = "--task") -> CliTask:
        """The task ``name``; an unknown name raises a ``ValueError`` naming ``option`` and the known tasks."""
        try:
            return self._tasks[name]
        except KeyError:
            raise ValueError(f"{option}: unknown task {name!r}. Known tasks: {', '.join(self.names())}.") from None

    def names(self) -> tuple[str, ...]:
        """Every registered name, in alphabetical order."""
        return tuple(sorted(self._tasks))

    def help(self, describe: bool = True) -> str:
        """``'arithmetic' (...), 'gsm8k' (math answers) or 'reverse' (...)``: every task (with its help when
        ``describe``), for ``--help``."""
        items = [f"{task.name!r} ({task.help})" if describe else repr(task.name) for task in self]
        return " or ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[CliTask]:
        return iter([self._tasks[name] for name in self.names()])


#: The tasks of the command line's ``--task``: each module of ``trl_reasoning.tasks`` registers its own.
TASKS = TaskRegistry()
