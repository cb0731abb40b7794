"""``PromptDataModule``'s settings groups, each typed, documented and checked once, and the migration of flat ones.

``PromptDataModule(source="jsonl", files=FileSettings(train_path="train.jsonl"), splits=SplitSettings(val_size=32),
...)``; on the command line ``--data.files.train_path train.jsonl``, in YAML ``data: {files: {train_path: ...}}``. Each
registered task adds the group of its own settings under its name (``--data.maze.rows 5``;
:mod:`lit_fgrpo.tasks.registry`), so :func:`settings_groups` is the data module's groups and the tasks'. Each group
refuses a wrong value on construction with one :class:`~lit_fgrpo.errors.ConfigError` naming the full flag
(``--data.splits.num_train must be >= 1, got 0``); the checks that need two groups (a file source without
``files.train_path``) are the data module's.

Checkpoints written before the groups existed store the settings flat (``{"num_train": 300, "maze_rows": 4, ...}``
in ``datamodule_hyper_parameters``); :func:`grouped_data_settings` maps them onto the groups (:func:`flat_names`
says where each old name lives now, a task's from its registration), for ``PromptDataModule.load_from_checkpoint``
and the resume check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lit_fgrpo.data.records import NonStringAnswers, TooLongPolicy
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.settings_mapping import (
    check_choice,
    check_int,
    check_text,
    group_flat_settings,
    settings_from,
)
from lit_fgrpo.tasks.registry import registered_tasks, task_names

FILE_SOURCES = ("jsonl", "parquet", "disk")
"""The sources that read ``--data.files.*``."""
GYM_SOURCE = "reasoning_gym"
"""The source that generates a reasoning-gym dataset by name (``--data.reasoning_gym.*``)."""
ENVIRONMENT_SOURCE = "environment"
"""The source whose rows the environment fills (its ``reset()`` gives the prompt; ``--data.environment_rows.*``,
:mod:`lit_fgrpo.data.environment_rows`)."""
FLAG = "--data"
"""How the CLI names the data module's settings."""


@dataclass(frozen=True)
class FileSettings:
    """The ``jsonl``, ``parquet`` and ``disk`` sources: which files, and which fields hold the prompt and answer."""

    train_path: str | None = None
    """Training file or folder (required with source ``jsonl``, ``parquet`` or ``disk``)."""
    val_path: str | None = None
    """Validation file or folder; if unset, ``splits.val_size`` training rows are held out instead."""
    test_path: str | None = None
    """Optional test file or folder."""
    prompt_field: str = "prompt"
    """Field holding the prompt: a string, or a list of chat messages."""
    answer_field: str | None = "answer"
    """Required answer field (checked in every row), passed to rewards as the ``answer`` column (a string, by
    ``non_string_answers``; the field's own column keeps its type); null: no answer required, every column passed as
    the file has it (for an environment or rewards that need no answer)."""
    non_string_answers: NonStringAnswers = "error"
    """An answer that is a number or a list: ``error`` (file and row named) or ``str`` (converted with ``str()``,
    counted and logged). Only the ``answer`` column is converted."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.files"
        for name in ("train_path", "val_path", "test_path"):
            check_text(f"{flag}.{name}", getattr(self, name), optional=True)
        check_text(f"{flag}.prompt_field", self.prompt_field)
        check_text(f"{flag}.answer_field", self.answer_field, optional=True)
        check_choice(f"{flag}.non_string_answers", self.non_string_answers, NonStringAnswers)


@dataclass(frozen=True)
class ReasoningGymSettings:
    """The ``reasoning_gym`` source: a reasoning-gym dataset by name, generated offline."""

    name: str | None = None
    """reasoning-gym dataset name, e.g. ``countdown`` (required with source ``reasoning_gym``)."""
    dataset_size: int = 1000
    """Training entries to generate (the validation entries are ``splits.val_size`` more)."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.reasoning_gym"
        check_text(f"{flag}.name", self.name, optional=True)
        check_int(f"{flag}.dataset_size", self.dataset_size, 1)


@dataclass(frozen=True)
class EnvironmentRowSettings:
    """The ``environment`` source's evaluation rows (its training rows never end)."""

    val_size: int = 0
    """Episodes of each validation (rows of the ``val`` split; 0 = no validation)."""
    test_size: int = 0
    """Episodes of a test (rows of the ``test`` split; 0 = none)."""

    def __post_init__(self) -> None:
        for name in ("val_size", "test_size"):
            check_int(f"{FLAG}.environment_rows.{name}", getattr(self, name), 0)


@dataclass(frozen=True)
class SplitSettings:
    """How many prompts each split holds."""

    num_train: int = 1000
    """Training prompts of a task (generated: mazes, arithmetic questions)."""
    num_val: int = 100
    """Validation prompts of a task."""
    num_test: int = 100
    """Test prompts of a task."""
    val_size: int = 64
    """Training rows held out for validation when ``files.val_path`` is unset, or reasoning-gym validation entries
    (0 = none)."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.splits"
        check_int(f"{flag}.num_train", self.num_train, 1)
        for name in ("num_val", "num_test", "val_size"):
            check_int(f"{flag}.{name}", getattr(self, name), 0)


@dataclass(frozen=True)
class PromptSettings:
    """How every source's prompts are rendered: the system message and the length limit."""

    system_prompt: str | None = None
    """Optional system message, e.g. "Please reason step by step, and put your final answer within \\boxed{}."."""
    max_length: int = 512
    """Longest prompt in tokens."""
    too_long: TooLongPolicy = "skip"
    """Longer prompts: ``skip`` (counted, warned), ``truncate_left`` (keep the last tokens, counted, warned) or
    ``error``."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.prompts"
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError(f"{flag}.system_prompt: expected a string, got {self.system_prompt!r}")
        check_int(f"{flag}.max_length", self.max_length, 1)
        check_choice(f"{flag}.too_long", self.too_long, TooLongPolicy)


# The group is `loader`, not `batching`: Lightning logs the module's and the data module's hyperparameters merged
# and refuses a key of both with different values, and FGRPOModule has `batching`.
@dataclass(frozen=True)
class LoaderSettings:
    """The data loaders: prompts per batch over all ranks, and worker processes."""

    prompts_per_step: int = 8
    """Prompts per training step over all ranks (global P); each rank takes P / world_size, which must be a whole
    number."""
    val_batch_size: int | None = None
    """Prompts per validation/test batch over all ranks (each rank takes the rounded-up share); None =
    ``prompts_per_step``."""
    num_workers: int = 0
    """Dataloader worker processes (0 loads in the main process; the resume point is exact either way)."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.loader"
        check_int(f"{flag}.prompts_per_step", self.prompts_per_step, 1)
        if self.val_batch_size is not None:
            check_int(f"{flag}.val_batch_size", self.val_batch_size, 1)
        check_int(f"{flag}.num_workers", self.num_workers, 0)

    @property
    def eval_batch_size(self) -> int:
        """Prompts per validation/test batch over all ranks: ``val_batch_size``, else ``prompts_per_step``."""
        return self.val_batch_size if self.val_batch_size is not None else self.prompts_per_step


OWN_GROUPS: dict[str, type] = {
    "files": FileSettings,
    "reasoning_gym": ReasoningGymSettings,
    "environment_rows": EnvironmentRowSettings,
    "splits": SplitSettings,
    "prompts": PromptSettings,
    "loader": LoaderSettings,
}
"""The data module's own settings groups by init argument name; each registered task adds one."""
TOP_LEVEL = ("source", "seed", "tokenizer_path")
"""The data module's settings outside any group."""
OWN_FLAT_NAMES: dict[str, tuple[str, str]] = {
    "train_path": ("files", "train_path"),
    "val_path": ("files", "val_path"),
    "test_path": ("files", "test_path"),
    "prompt_field": ("files", "prompt_field"),
    "answer_field": ("files", "answer_field"),
    "non_string_answers": ("files", "non_string_answers"),
    "reasoning_gym_name": ("reasoning_gym", "name"),
    "dataset_size": ("reasoning_gym", "dataset_size"),
    "num_train": ("splits", "num_train"),
    "num_val": ("splits", "num_val"),
    "num_test": ("splits", "num_test"),
    "val_size": ("splits", "val_size"),
    "system_prompt": ("prompts", "system_prompt"),
    "max_prompt_length": ("prompts", "max_length"),
    "too_long": ("prompts", "too_long"),
    "prompts_per_step": ("loader", "prompts_per_step"),
    "val_batch_size": ("loader", "val_batch_size"),
    "num_workers": ("loader", "num_workers"),
}
"""Where each of the data module's own settings that checkpoints written before the groups stored flat lives now:
``"num_train": ("splits", "num_train")`` (``--data.splits.num_train``)."""


def source_names() -> tuple[str, ...]:
    """Every ``--data.source``: the file sources, the registered tasks (``maze``, ``arithmetic``), reasoning-gym and
    ``environment`` (the environment's ``reset()`` gives each prompt)."""
    return (*FILE_SOURCES, *task_names(), GYM_SOURCE, ENVIRONMENT_SOURCE)


def settings_groups() -> dict[str, type]:
    """Every settings group of ``PromptDataModule`` by init argument name: ``files``, one per registered task (its
    name: its settings class), then ``reasoning_gym``, ``environment_rows``, ``splits``, ``prompts`` and ``loader``."""
    tasks = {task.name: task.settings for task in registered_tasks()}
    return {"files": FileSettings} | tasks | {name: cls for name, cls in OWN_GROUPS.items() if name != "files"}


def flat_names() -> dict[str, tuple[str, str]]:
    """Where each setting that checkpoints written before the groups stored flat lives now: ``"maze_rows": ("maze",
    "rows")`` (``--data.maze.rows``); a task's old names come from its registration."""
    tasks = {old: (task.name, field) for task in registered_tasks() for old, field in task.flat_names.items()}
    return OWN_FLAT_NAMES | tasks


def new_flag(name: str) -> str | None:
    """The flag of an old flat setting now (``maze_rows`` -> ``--data.maze.rows``), or None for no such name."""
    found = flat_names().get(name)
    return None if found is None else f"{FLAG}.{found[0]}.{found[1]}"


def tasks_settings(given: dict[str, Any]) -> dict[str, Any]:
    """Every registered task's settings: ``given[name]`` (an instance or a mapping of its fields), else the defaults.

    Raises:
        ConfigError: For a name that is no registered task (``--data.<name> is not a setting ...``), or a bad value.
    """
    tasks = registered_tasks()
    for name in given:
        if name not in {task.name for task in tasks}:
            raise ConfigError(
                f"{FLAG}.{name} is not a setting of PromptDataModule (nor a registered task: "
                f"{', '.join(task.name for task in tasks)})"
            )
    return {
        task.name: settings_from(task.settings, given.get(task.name, task.settings()), f"{FLAG}.{task.name}")
        for task in tasks
    }


def grouped_data_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings given flat (an old checkpoint's ``datamodule_hyper_parameters``), grouped, as ``PromptDataModule``
    takes them.

    ``{"num_train": 300, "maze_rows": 5, "seed": 1}`` -> ``{"splits": {"num_train": 300}, "maze": {"rows": 5},
    "seed": 1}``. Groups given as mappings (or as settings) are kept, with flat names merged into them; LightningCLI's
    ``_instantiator`` and ``_class_path`` are dropped.

    Raises:
        ConfigError: For a flat name that is no setting of the data module (nor of an earlier version).
    """
    return group_flat_settings(values, settings_groups(), flat_names(), TOP_LEVEL, FLAG, "PromptDataModule")


__all__ = [
    "ENVIRONMENT_SOURCE",
    "FILE_SOURCES",
    "GYM_SOURCE",
    "OWN_FLAT_NAMES",
    "OWN_GROUPS",
    "TOP_LEVEL",
    "EnvironmentRowSettings",
    "FileSettings",
    "LoaderSettings",
    "PromptSettings",
    "ReasoningGymSettings",
    "SplitSettings",
    "flat_names",
    "grouped_data_settings",
    "new_flag",
    "settings_groups",
    "source_names",
    "tasks_settings",
]
