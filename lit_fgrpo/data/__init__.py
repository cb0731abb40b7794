"""Prompt sources, rendering, the resumable sharded stream and the Lightning data module."""

from lit_fgrpo.data.data_settings import (
    ENVIRONMENT_SOURCE,
    EnvironmentRowSettings,
    FileSettings,
    LoaderSettings,
    PromptSettings,
    ReasoningGymSettings,
    SplitSettings,
    grouped_data_settings,
)
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.data.generated_sources import read_reasoning_gym, read_task_splits
from lit_fgrpo.data.records import PromptRecord, SourceExample, TooLongPolicy, render_prompt, render_records
from lit_fgrpo.data.sources import read_disk_dataset, read_jsonl, read_parquet
from lit_fgrpo.data.streaming import PromptStream

__all__ = [
    "ENVIRONMENT_SOURCE",
    "EnvironmentRowSettings",
    "FileSettings",
    "LoaderSettings",
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
    "read_parquet",
    "read_reasoning_gym",
    "read_task_splits",
    "render_prompt",
    "render_records",
]
