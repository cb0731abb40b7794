"""``PromptDataModule``'s settings groups, each typed, documented and checked once, and the migration of flat ones.

``PromptDataModule(source="maze", maze=MazeSettings(rows=5), splits=SplitSettings(num_train=500), ...)``; on the
command line ``--data.maze.rows 5``, in YAML ``data: {maze: {rows: 5}}``. Each group refuses a wrong value on
construction with one :class:`~lit_fgrpo.errors.ConfigError` naming the full flag (``--data.maze.rows must be >= 1,
got 0``); the checks that need two groups (a file source without ``files.train_path``) are the data module's.

Checkpoints written before the groups existed store the settings flat (``{"num_train": 300, "maze_rows": 4, ...}``
in ``datamodule_hyper_parameters``); :func:`grouped_data_settings` maps them onto the groups (:data:`FLAT_NAMES`
says where each old name lives now), and :func:`data_checkpoint_init_args` reads them from a checkpoint for
``PromptDataModule.load_from_checkpoint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

from lit_fgrpo.data.records import NonStringAnswers, TooLongPolicy
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.settings_mapping import group_flat_settings, saved_hparams
from lit_fgrpo.tasks.arithmetic import ArithmeticSettings
from lit_fgrpo.tasks.maze import MazeConfig

Source = Literal["jsonl", "parquet", "disk", "maze", "reasoning_gym", "arithmetic"]
"""Where prompts come from (``--data.source``)."""
FILE_SOURCES = ("jsonl", "parquet", "disk")
"""The sources that read ``--data.files.*``."""
FLAG = "--data"
"""How the CLI names the data module's settings."""


def check_int(flag: str, value: Any, minimum: int) -> None:
    """Refuse a ``value`` that is not an int (a bool is not) or is below ``minimum``, naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag}: expected an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{flag} must be >= {minimum}, got {value}")


def check_choice(flag: str, value: Any, choices: Any) -> None:
    """Refuse a ``value`` that is not one of the ``Literal`` type ``choices``, naming ``flag``."""
    if value not in get_args(choices):
        raise ConfigError(f"{flag} must be one of {get_args(choices)}, got {value!r}")


def check_text(flag: str, value: Any, optional: bool = False) -> None:
    """Refuse a ``value`` that is not a non-empty string (or ``None`` when ``optional``), naming ``flag``."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{flag} must be a non-empty string, got {value!r}")


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
    answer_field: str = "answer"
    """Required answer field (checked in every row), passed to rewards as the ``answer`` column."""
    non_string_answers: NonStringAnswers = "error"
    """An answer that is a number or a list: ``error`` (file and row named) or ``str`` (converted with ``str()``,
    counted and logged)."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.files"
        for name in ("train_path", "val_path", "test_path"):
            check_text(f"{flag}.{name}", getattr(self, name), optional=True)
        check_text(f"{flag}.prompt_field", self.prompt_field)
        check_text(f"{flag}.answer_field", self.answer_field)
        check_choice(f"{flag}.non_string_answers", self.non_string_answers, NonStringAnswers)


@dataclass(frozen=True)
class MazeSettings:
    """The ``maze`` source's mazes: size and prompt layout (:class:`~lit_fgrpo.tasks.maze.MazeConfig`)."""

    rows: int = 4
    """Maze cell rows (the token grid has 2 rows + 1)."""
    cols: int = 4
    """Maze cell columns (the token grid has 2 cols + 1)."""
    newline_tokens: bool = True
    """End every maze prompt row with a ``NEWLINE`` token."""
    border_walls: bool = True
    """Write the outer wall border in maze prompts."""

    def __post_init__(self) -> None:
        flag = f"{FLAG}.maze"
        check_int(f"{flag}.rows", self.rows, 1)
        check_int(f"{flag}.cols", self.cols, 1)
        if self.rows * self.cols < 2:
            raise ConfigError(f"{flag}.rows x cols must give at least two cells (a start and a goal), got 1x1")
        for name in ("newline_tokens", "border_walls"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{flag}.{name}: expected true or false, got {getattr(self, name)!r}")

    def config(self) -> MazeConfig:
        """The task's :class:`~lit_fgrpo.tasks.maze.MazeConfig` of these settings."""
        return MazeConfig(
            rows=self.rows, cols=self.cols, newline_tokens=self.newline_tokens, border_walls=self.border_walls
        )


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
class SplitSettings:
    """How many prompts each split holds."""

    num_train: int = 1000
    """Training mazes or arithmetic questions."""
    num_val: int = 100
    """Validation mazes or arithmetic questions."""
    num_test: int = 100
    """Test mazes or arithmetic questions."""
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


GROUPS: dict[str, type] = {
    "files": FileSettings,
    "maze": MazeSettings,
    "arithmetic": ArithmeticSettings,
    "reasoning_gym": ReasoningGymSettings,
    "splits": SplitSettings,
    "prompts": PromptSettings,
    "loader": LoaderSettings,
}
"""``PromptDataModule``'s settings groups by init argument name."""
TOP_LEVEL = ("source", "seed", "tokenizer_path")
"""The data module's settings outside any group."""
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "train_path": ("files", "train_path"),
    "val_path": ("files", "val_path"),
    "test_path": ("files", "test_path"),
    "prompt_field": ("files", "prompt_field"),
    "answer_field": ("files", "answer_field"),
    "non_string_answers": ("files", "non_string_answers"),
    "maze_rows": ("maze", "rows"),
    "maze_cols": ("maze", "cols"),
    "maze_newline_tokens": ("maze", "newline_tokens"),
    "maze_border_walls": ("maze", "border_walls"),
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
"""Where each setting that checkpoints written before the groups stored flat lives now: ``"maze_rows": ("maze",
"rows")`` (``--data.maze.rows``)."""


def new_flag(name: str) -> str | None:
    """The flag of an old flat setting now (``maze_rows`` -> ``--data.maze.rows``), or None for no such name."""
    if name not in FLAT_NAMES:
        return None
    group, field = FLAT_NAMES[name]
    return f"{FLAG}.{group}.{field}"


def grouped_data_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings given flat (an old checkpoint's ``datamodule_hyper_parameters``), grouped, as ``PromptDataModule``
    takes them.

    ``{"num_train": 300, "maze_rows": 5, "seed": 1}`` -> ``{"splits": {"num_train": 300}, "maze": {"rows": 5},
    "seed": 1}``. Groups given as mappings (or as settings) are kept, with flat names merged into them; LightningCLI's
    ``_instantiator`` and ``_class_path`` are dropped.

    Raises:
        ConfigError: For a flat name that is no setting of the data module (nor of an earlier version).
    """
    return group_flat_settings(values, GROUPS, FLAT_NAMES, TOP_LEVEL, FLAG, "PromptDataModule")


def is_flat(values: Mapping[str, Any]) -> bool:
    """Whether ``values`` name a setting flat (``num_train``) rather than in its group (``splits.num_train``)."""
    return any(key in FLAT_NAMES for key in values)


def data_checkpoint_init_args(checkpoint_path: str | Path | IO[bytes]) -> dict[str, Any]:
    """The grouped init arguments of a checkpoint whose data settings are flat (``{}`` for a grouped one).

    A file is memory-mapped, so that only the hyperparameters are read. The result also clears LightningCLI's
    ``_instantiator``: its parser would refuse the flat names.
    """
    saved = saved_hparams(checkpoint_path, "datamodule_hyper_parameters")
    if not is_flat(saved):
        return {}
    return grouped_data_settings(saved) | {"_instantiator": None}


__all__ = [
    "FILE_SOURCES",
    "FLAT_NAMES",
    "GROUPS",
    "TOP_LEVEL",
    "ArithmeticSettings",
    "FileSettings",
    "LoaderSettings",
    "MazeSettings",
    "PromptSettings",
    "ReasoningGymSettings",
    "Source",
    "SplitSettings",
    "data_checkpoint_init_args",
    "grouped_data_settings",
    "is_flat",
    "new_flag",
]
