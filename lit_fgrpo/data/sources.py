"""Prompt sources: JSONL, Parquet, ``datasets`` folders, reasoning-gym and the registered tasks, read as
:class:`~lit_fgrpo.data.records.SourceExample` rows.

Every reader error names the source (file and 1-based line or row) and the problem, and an empty source is an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.data.records import NonStringAnswers, SourceExample
from lit_fgrpo.errors import DataError
from lit_fgrpo.tasks.registry import get_task

log = logging.getLogger(__name__)


def _check_row(
    row: Any,
    where: str,
    prompt_field: str,
    required_columns: Sequence[str],
    index: int,
    non_string: NonStringAnswers = "error",
) -> SourceExample:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [name for name in (prompt_field, *required_columns) if name not in row or row[name] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing} (present: {sorted(row)})")
    question = row[prompt_field]
    is_messages = isinstance(question, list) and all(isinstance(m, dict) and "content" in m for m in question)
    if not (isinstance(question, str) or is_messages):
        raise DataError(
            f"{where}: field {prompt_field!r} must be a string or a list of chat messages, got {type(question).__name__}"
        )
    columns = {name: value for name, value in row.items() if name != prompt_field}
    for name in required_columns:
        value = columns[name]
        if isinstance(value, str):
            continue
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if non_string == "str" and is_number:
            columns[name] = str(value)
            continue
        raise DataError(
            f"{where}: field {name!r} must be a string, got {type(value).__name__} {value!r}",
            hint="write the answer as a string (numbers can be converted with --data.files.non_string_answers str)",
        )
    return SourceExample(question=question, columns=columns, index=index)


def _nonempty(examples: list[SourceExample], source: str) -> list[SourceExample]:
    if not examples:
        raise DataError(f"{source}: the dataset is empty")
    return examples


def _log_conversions(
    raw_rows: Sequence[Any], examples: Sequence[SourceExample], columns: Sequence[str], src: str
) -> None:
    converted = sum(
        1
        for row, ex in zip(raw_rows, examples)
        for name in columns
        if isinstance(row, dict) and not isinstance(row.get(name), str) and isinstance(ex.columns.get(name), str)
    )
    if converted:
        log.warning("%s: converted %d non-string value(s) of %s to strings with str()", src, converted, list(columns))


def _refuse_duplicate_keys(where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise DataError(f"{where}: duplicate key {key!r} in one JSON object")
            seen[key] = value
        return seen

    return hook


def _table_examples(
    rows: list[dict[str, Any]],
    column_names: Sequence[str],
    path: str | Path,
    prompt_field: str,
    required_columns: Sequence[str],
    non_string_answers: NonStringAnswers,
) -> list[SourceExample]:
    """The checked examples of a table's rows (Parquet, ``datasets``), after checking its columns; rows count from 1."""
    missing = [name for name in (prompt_field, *required_columns) if name not in column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing} (present: {list(column_names)})")
    examples = [
        _check_row(row, f"{path}: row {i + 1}", prompt_field, required_columns, i, non_string_answers)
        for i, row in enumerate(rows)
    ]
    _log_conversions(rows, examples, required_columns, str(path))
    return _nonempty(examples, str(path))


def read_jsonl(
    path: str | Path,
    prompt_field: str = "prompt",
    required_columns: Sequence[str] = ("answer",),
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read one UTF-8 JSON object per line; blank lines are allowed and ignored.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataError: ``"<path>:<line>: ..."`` for a non-UTF-8 byte, malformed JSON, a duplicated key, a missing field or
            a field of the wrong type (see :data:`NonStringAnswers`), or if the file has no rows.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such JSONL file: {path}")
    examples: list[SourceExample] = []
    raw_rows: list[Any] = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{where}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})",
                    hint="re-encode the file as UTF-8",
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=_refuse_duplicate_keys(where))
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: malformed JSON ({err.msg}, column {err.colno})") from None
            raw_rows.append(row)
            examples.append(_check_row(row, where, prompt_field, required_columns, len(examples), non_string_answers))
    _log_conversions(raw_rows, examples, required_columns, str(path))
    return _nonempty(examples, str(path))


def read_parquet(
    path: str | Path,
    prompt_field: str = "prompt",
    required_columns: Sequence[str] = ("answer",),
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read a Parquet file with ``pyarrow``; errors name the file and the 1-based row.

    Raises:
        ImportError: If ``pyarrow`` is not installed.
        FileNotFoundError: If the file does not exist.
        DataError: If the file is not Parquet, a column is missing, a row is bad, or the file has no rows.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such Parquet file: {path}")
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError("reading Parquet needs pyarrow: pip install 'lit_fgrpo[dev]' or pip install pyarrow") from err
    check_parquet_file(path)
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for damaged files
        raise DataError(f"{path}: unreadable Parquet file ({type(err).__name__}: {err})") from None
    return _table_examples(
        table.to_pylist(), table.column_names, path, prompt_field, required_columns, non_string_answers
    )


def check_parquet_file(path: str | Path) -> None:
    """Refuse a file that is not Parquet (it must start and end with the ``PAR1`` magic), naming it.

    Raises:
        DataError: If the file is too short or lacks the magic bytes.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(4)
        handle.seek(max(size - 4, 0))
        tail = handle.read(4)
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        raise DataError(f"{path}: not a Parquet file (no PAR1 magic at its start and end; {size} bytes)")


def read_disk_dataset(
    path: str | Path,
    split: str,
    prompt_field: str = "prompt",
    required_columns: Sequence[str] = ("answer",),
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read a Hugging Face ``datasets`` folder written by ``save_to_disk`` (a Dataset or one split of a DatasetDict).

    Raises:
        ImportError: If ``datasets`` is not installed.
        FileNotFoundError: If the folder does not exist.
        DataError: If the folder is not a ``save_to_disk`` folder, the split or a column is missing, a row is bad, or
            the dataset is empty.
    """
    try:
        import datasets
    except ImportError as err:
        raise ImportError("source='disk' needs the 'datasets' package: pip install datasets") from err
    check_dataset_folder(path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # damaged arrow files, bad JSON metadata
        raise DataError(f"{path}: unreadable datasets folder ({type(err).__name__}: {err})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r} (splits: {list(loaded)})")
        loaded = loaded[split]
    return _table_examples(list(loaded), loaded.column_names, path, prompt_field, required_columns, non_string_answers)


def check_dataset_folder(path: str | Path) -> None:
    """Refuse a path that is not a ``datasets`` ``save_to_disk`` folder, naming it.

    Raises:
        FileNotFoundError: If nothing is at ``path``.
        DataError: If ``path`` is a file, or a folder without ``dataset_info.json`` / ``dataset_dict.json``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such datasets folder: {path}")
    if not path.is_dir():
        raise DataError(f"{path}: not a datasets folder (a file; source='disk' wants a save_to_disk folder)")
    markers = ("dataset_info.json", "dataset_dict.json", "state.json")
    if not any((path / marker).is_file() for marker in markers):
        raise DataError(f"{path}: not a datasets folder (none of {list(markers)} inside; written by save_to_disk?)")


def read_reasoning_gym(name: str, seed: int, size: int) -> list[SourceExample]:
    """Generate ``size`` entries of a reasoning-gym dataset (offline, deterministic per seed).

    Columns: ``answer`` (the reference answer) and ``entry`` (the whole entry, which ``score_answer`` needs).

    Raises:
        ImportError: If ``reasoning_gym`` is not installed.
        DataError: If no dataset has that name.
    """
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as err:
        raise ImportError("source='reasoning_gym' needs reasoning-gym: pip install 'lit_fgrpo[reasoning-gym]'") from err
    if name not in DATASETS:
        raise DataError(f"unknown reasoning-gym dataset {name!r}; e.g. {sorted(DATASETS)[:8]}")
    dataset = reasoning_gym.create_dataset(name, seed=seed, size=size)
    examples = [
        SourceExample(question=entry["question"], columns={"answer": entry["answer"], "entry": entry}, index=i)
        for i, entry in enumerate(dataset)
    ]
    return _nonempty(examples, f"reasoning_gym:{name}")


def read_task_splits(
    name: str, settings: Any, num_train: int, num_val: int, num_test: int, seed: int
) -> dict[str, list[SourceExample]]:
    """Draw a registered task's disjoint train/val/test prompts (:mod:`lit_fgrpo.tasks.registry`).

    Args:
        name: The task's name (``--data.source``).
        settings: The task's settings (``--data.<name>``).
        num_train: Training prompts.
        num_val: Validation prompts.
        num_test: Test prompts.
        seed: Seed of the task's generator.
    """
    splits = get_task(name).splits(settings, num_train, num_val, num_test, seed)
    return {
        split: [SourceExample(question=p.question, columns=dict(p.columns), index=i) for i, p in enumerate(prompts)]
        for split, prompts in splits.items()
    }
