"""The file sources' splits (``jsonl``, ``parquet``, ``disk``): each file read by the answer rule
(:mod:`lit_fgrpo.data.sources`), and validation rows held out of the training file when no validation file is given.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lit_fgrpo.data.data_settings import FLAG, FileSettings
from lit_fgrpo.data.records import SourceExample
from lit_fgrpo.data.sources import read_disk_dataset, read_jsonl, read_parquet
from lit_fgrpo.errors import ConfigError, DataError


def check_file_paths(source: str, files: FileSettings) -> None:
    """Refuse a file ``source`` without ``files.train_path``, or a path that does not exist, naming the flag.

    Raises:
        ConfigError: Without ``--data.files.train_path``.
        DataError: For a path that does not exist.
    """
    if files.train_path is None:
        raise ConfigError(f"{FLAG}.files.train_path is required with {FLAG}.source {source}")
    for name in ("train_path", "val_path", "test_path"):
        path = getattr(files, name)
        if path is not None and not Path(path).exists():
            raise DataError(f"{FLAG}.files.{name} does not exist: {path}")


def read_file(source: str, path: str, files: FileSettings) -> list[SourceExample]:
    """The rows of one file (or ``datasets`` folder, its ``train`` split) of a file ``source``, by ``files``' fields
    and answer rule."""
    prompt, answer, rule = files.prompt_field, files.answer_field, files.non_string_answers
    if source == "jsonl":
        return read_jsonl(path, prompt, answer, non_string_answers=rule)
    if source == "parquet":
        return read_parquet(path, prompt, answer, non_string_answers=rule)
    return read_disk_dataset(path, "train", prompt, answer, non_string_answers=rule)


def held_out(examples: list[SourceExample], size: int, seed: int, path: str) -> dict[str, list[SourceExample]]:
    """``train`` and ``val``: ``size`` rows drawn by ``seed`` held out of ``examples`` for validation.

    Raises:
        DataError: Naming ``--data.splits.val_size`` when it leaves no training rows.
    """
    if size >= len(examples):
        raise DataError(
            f"{FLAG}.splits.val_size={size} leaves no training rows of {len(examples)} in {path}",
            hint=f"hold out fewer rows, or give {FLAG}.files.val_path",
        )
    drawn = set(torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))[:size].tolist())
    return {
        "train": [example for example in examples if example.index not in drawn],
        "val": [example for example in examples if example.index in drawn],
    }


def read_file_splits(source: str, files: FileSettings, val_size: int, seed: int) -> dict[str, list[SourceExample]]:
    """The ``train`` split of ``files.train_path``; ``val`` from ``files.val_path``, else ``val_size`` rows held out of
    the training file (none when 0); ``test`` from ``files.test_path`` when given."""
    assert files.train_path is not None, "read_file_splits needs files.train_path"
    splits = {"train": read_file(source, files.train_path, files)}
    if files.val_path is not None:
        splits["val"] = read_file(source, files.val_path, files)
    elif val_size:
        splits = held_out(splits["train"], val_size, seed, files.train_path)
    if files.test_path is not None:
        splits["test"] = read_file(source, files.test_path, files)
    return splits


__all__ = ["check_file_paths", "held_out", "read_file", "read_file_splits"]
