"""Prompt sources, rendering, the resumable sharded stream and the Lightning data module."""

from lit_fgrpo.data.data_settings import (
    FileSettings,
    LoaderSettings,
    MazeSettings,
    PromptSettings,
    ReasoningGymSettings,
    SplitSettings,
    grouped_data_settings,
)
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.data.records import PromptRecord, SourceExample, TooLongPolicy, render_prompt, render_records
from lit_fgrpo.data.sources import read_disk_dataset, read_jsonl, read_maze_splits, read_parquet, read_reasoning_gym
from lit_fgrpo.data.streaming import PromptStream

__all__ = [
    "FileSettings",
    "LoaderSettings",
    "MazeSettings",
    "PromptDataModule",
    "PromptRecord",
    "PromptSettings",
    "PromptStream",
    "ReasoningGymSettings",
    "SourceExample",
    "SplitSettings",
    "TooLongPolicy",
    "grouped_data_settings",
    "read_disk_dataset",
    "read_jsonl",
    "read_maze_splits",
    "read_parquet",
    "read_reasoning_gym",
    "render_prompt",
    "render_records",
]
