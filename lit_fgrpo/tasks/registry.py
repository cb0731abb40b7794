"""The task registry: what the core needs from a task, looked up by the task's name.

A task registers a :class:`Task`: its settings group (``--data.<name>.*``), its prompt splits, its default reward
and, where it has one, its own tokenizer (``builtin:<name>``). The data module, the policy's tokenizer and the
rollout's default reward read it by name (``--data.source maze``), so none of them names a task::

    register_task(Task(name="sums", settings=SumSettings, splits=sum_prompts, reward="last_number"))
    PromptDataModule(source="sums", sums={"max_value": 9})

Importing :mod:`lit_fgrpo.tasks` registers the built-in tasks (:mod:`lit_fgrpo.tasks.builtin`), the first of them
(the maze) as the default task: the data source and the reward of a run that names neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_fgrpo.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
"""A tokenizer named ``builtin:<task>`` is the task's own (``builtin:maze``), not a folder."""


@dataclass(frozen=True)
class TaskPrompt:
    """One generated prompt: the question text and the columns the rewards receive (the ``answer`` at least)."""

    question: str
    """The prompt text, rendered with the tokenizer's chat template (if any) like every source's."""
    columns: dict[str, Any]
    """``{"answer": ...}`` and any extra columns, passed to the reward functions."""


SplitsFn = Callable[[Any, int, int, int, int], Mapping[str, Sequence[TaskPrompt]]]
"""``splits(settings, num_train, num_val, num_test, seed) -> {"train": [...], "val": [...], "test": [...]}``."""


@dataclass(frozen=True)
class Task:
    """What the core needs from one task."""

    name: str
    """The ``--data.source`` value, the settings group (``--data.<name>.*``) and the ``builtin:<name>`` tokenizer."""
    settings: type
    """The settings dataclass of ``--data.<name>``; built with no arguments it holds the defaults, and its
    ``__post_init__`` refuses a wrong value in one line naming the flag."""
    splits: SplitsFn
    """Draws the disjoint train/val/test prompts from the settings, deterministically per seed."""
    reward: str | None = None
    """The reward (a name of :mod:`lit_fgrpo.rewards.registry`) a run on this task scores with when none is given."""
    tokenizer: Callable[[], Any] | None = None
    """Builds the task's own tokenizer (``builtin:<name>``); ``None``: the policy's tokenizer is used."""
    flat_names: Mapping[str, str] = field(default_factory=dict)
    """Old flat data settings of this task (checkpoints from before the groups) -> field: ``{"maze_rows": "rows"}``."""


_TASKS: dict[str, Task] = {}
_default: str | None = None  # the default task's name, once one is registered


def register_task(task: Task, *, default: bool = False) -> None:
    """Make ``task`` available by its name; ``default`` makes it the task of a run that names none.

    Raises:
        ValueError: If another task has that name.
    """
    global _default
    if task.name in _TASKS and _TASKS[task.name] != task:
        raise ValueError(f"a task named {task.name!r} is registered already")
    _TASKS[task.name] = task
    if default or _default is None:
        _default = task.name


def unregister_task(name: str) -> None:
    """Forget the task ``name`` (a plug-in's, or a test's); the default task cannot be removed."""
    if name == _default:
        raise ValueError(f"{name!r} is the default task")
    _TASKS.pop(name, None)


def task_names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(_TASKS)


def registered_tasks() -> tuple[Task, ...]:
    """The registered tasks, in registration order."""
    return tuple(_TASKS.values())


def find_task(name: str) -> Task | None:
    """The task registered as ``name``, or ``None``."""
    return _TASKS.get(name)


def get_task(name: str, flag: str = "--data.source") -> Task:
    """The task registered as ``name``.

    Raises:
        ConfigError: ``<flag>: no task named ...`` with the registered names.
    """
    if name not in _TASKS:
        raise ConfigError(f"{flag}: no task named {name!r}; the tasks are {', '.join(_TASKS)}")
    return _TASKS[name]


def default_task() -> Task:
    """The task of a run that names none (the maze, when the built-in tasks are registered)."""
    if _default is None:
        raise LookupError("no task is registered: import lit_fgrpo.tasks")
    return _TASKS[_default]


def default_reward() -> str:
    """The reward of a run that gives none: the default task's."""
    reward = default_task().reward
    if reward is None:
        raise ConfigError(f"the default task {default_task().name!r} has no reward: give --rollout.reward_funcs")
    return reward


def is_builtin_tokenizer(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a task's own tokenizer (``builtin:maze``) rather than a folder."""
    return name_or_path.startswith(BUILTIN_PREFIX)


def builtin_tokenizer_names() -> list[str]:
    """``builtin:<task>`` for every registered task that has a tokenizer of its own."""
    return [f"{BUILTIN_PREFIX}{task.name}" for task in _TASKS.values() if task.tokenizer is not None]


def load_tokenizer(name_or_path: str) -> Any:
    """A task's own tokenizer (``builtin:maze``), or a local tokenizer folder
    (:func:`lit_fgrpo.models.policy.load_tokenizer_folder`).

    Raises:
        ConfigError: For ``builtin:<name>`` with no registered task of that name that has a tokenizer.
        FileNotFoundError: For a path that does not exist.
    """
    if is_builtin_tokenizer(name_or_path):
        task = find_task(name_or_path[len(BUILTIN_PREFIX) :])
        if task is None or task.tokenizer is None:
            raise ConfigError(
                f"--model.policy.tokenizer: no built-in tokenizer {name_or_path!r}; "
                f"the built-in ones are {', '.join(builtin_tokenizer_names())}"
            )
        return task.tokenizer()
    from lit_fgrpo.models.policy import load_tokenizer_folder

    if not Path(name_or_path).exists():
        raise FileNotFoundError(
            f"--model.policy.tokenizer: {name_or_path!r} is not a local directory (no hub access at run time); "
            f"pass a saved tokenizer folder or {' or '.join(map(repr, builtin_tokenizer_names()))}"
        )
    return load_tokenizer_folder(name_or_path)


__all__ = [
    "BUILTIN_PREFIX",
    "SplitsFn",
    "Task",
    "TaskPrompt",
    "builtin_tokenizer_names",
    "default_reward",
    "default_task",
    "find_task",
    "get_task",
    "is_builtin_tokenizer",
    "load_tokenizer",
    "register_task",
    "registered_tasks",
    "task_names",
    "unregister_task",
]
