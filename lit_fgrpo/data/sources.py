"""Prompt files: JSONL, Parquet and ``datasets`` folders, read as :class:`~lit_fgrpo.data.records.SourceExample`
rows (the generated sources, reasoning-gym and the registered tasks, are :mod:`lit_fgrpo.data.generated_sources`).

Every reader error names the source (file and 1-based line or row) and the problem, and an empty source is an error.

The answer rule of the file readers: with ``answer_field`` set (``--data.files.answer_field``, default ``answer``)
every row must hold it, and its value reaches the rewards as the ``answer`` column, a string by the
:data:`~lit_fgrpo.data.records.NonStringAnswers` rule; when it names another field, that field's own column keeps
the file's type (an int stays an int for an environment's ``reset(**row)``). With ``answer_field=None`` nothing is
required, added or converted: every column arrives as the file has it (an ``answer`` column too).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.data.records import NonStringAnswers, SourceExample
from lit_fgrpo.errors import DataError

log = logging.getLogger(__name__)


ANSWER = "answer"
"""The column the reward functions read the reference answer from (``columns["answer"]``)."""
ANSWER_FLAG = "--data.files.answer_field"
"""The flag that names the answer field, named in the messages."""
NO_ANSWER_HINT = f"the answer field is {ANSWER_FLAG}; set it to null when no reward or environment needs an answer"
"""The hint of a missing answer field."""


def _checked_answer(value: Any, where: str, name: str, non_string: NonStringAnswers) -> str:
    """The answer ``value`` of field ``name`` as a string by the :data:`NonStringAnswers` rule."""
    if isinstance(value, str):
        return value
    if non_string == "str" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise DataError(
        f"{where}: field {name!r} must be a string, got {type(value).__name__} {value!r}",
        hint=(
            "write the answer as a string (numbers can be converted with --data.files.non_string_answers str; "
            f"{ANSWER_FLAG} null: no answer)"
        ),
    )


def _check_row(
    row: Any,
    where: str,
    prompt_field: str,
    answer_field: str | None,
    index: int,
    non_string: NonStringAnswers = "error",
) -> SourceExample:
    """One row as a :class:`SourceExample`: every field but the prompt kept as the file has it, plus the ``answer``
    column (the answer field's value, a string by ``non_string``) when ``answer_field`` is set.

    Raises:
        DataError: Naming ``where`` for a row that is no object, a missing prompt or answer, a prompt that is neither
            text nor chat messages, or an answer that is not a string under ``non_string``.
    """
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    required = (prompt_field,) if answer_field is None else (prompt_field, answer_field)
    missing = [name for name in required if name not in row or row[name] is None]
    if missing:
        hint = NO_ANSWER_HINT if answer_field in missing else None
        raise DataError(f"{where}: missing field(s) {missing} (present: {sorted(row)})", hint=hint)
    question = row[prompt_field]
    is_messages = isinstance(question, list) and all(isinstance(m, dict) and "content" in m for m in question)
    if not (isinstance(question, str) or is_messages):
        raise DataError(
            f"{where}: field {prompt_field!r} must be a string or a list of chat messages, got {type(question).__name__}"
        )
    columns = {name: value for name, value in row.items() if name != prompt_field}
    if answer_field is not None:  # the alias only: the answer field's own column keeps its type
        columns[ANSWER] = _checked_answer(row[answer_field], where, answer_field, non_string)
    return SourceExample(question=question, columns=columns, index=index)


def _nonempty(examples: list[SourceExample], source: str) -> list[SourceExample]:
    if not examples:
        raise DataError(f"{source}: the dataset is empty")
    return examples


def _log_conversions(
    raw_rows: Sequence[Any], examples: Sequence[SourceExample], answer_field: str | None, src: str
) -> None:
    if answer_field is None:
        return
    converted = sum(
        1
        for row, ex in zip(raw_rows, examples)
        if isinstance(row, dict)
        and not isinstance(row.get(answer_field), str)
        and isinstance(ex.columns.get(ANSWER), str)
    )
    if converted:
        log.warning("%s: converted %d non-string value(s) of %s to strings with str()", src, converted, [answer_field])


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
    answer_field: str | None,
    non_string_answers: NonStringAnswers,
) -> list[SourceExample]:
    """The checked examples of a table's rows (Parquet, ``datasets``), after checking its columns; rows count from 1."""
    required = (prompt_field,) if answer_field is None else (prompt_field, answer_field)
    missing = [name for name in required if name not in column_names]
    if missing:
        hint = NO_ANSWER_HINT if answer_field in missing else None
        raise DataError(f"{path}: missing column(s) {missing} (present: {list(column_names)})", hint=hint)
    examples = [
        _check_row(row, f"{path}: row {i + 1}", prompt_field, answer_field, i, non_string_answers)
        for i, row in enumerate(rows)
    ]
    _log_conversions(rows, examples, answer_field, str(path))
    return _nonempty(examples, str(path))


def read_jsonl(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str | None = ANSWER,
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read one UTF-8 JSON object per line; blank lines are allowed and ignored.

    Args:
        path: The file.
        prompt_field: The field holding the prompt (text or chat messages).
        answer_field: The field every row must hold, copied to the ``answer`` column as a string; ``None``: none
            (see the module's answer rule).
        non_string_answers: What to do with an answer that is not a string (:data:`NonStringAnswers`).

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
            examples.append(_check_row(row, where, prompt_field, answer_field, len(examples), non_string_answers))
    _log_conversions(raw_rows, examples, answer_field, str(path))
    return _nonempty(examples, str(path))


def read_parquet(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str | None = ANSWER,
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read a Parquet file with ``pyarrow``; errors name the file and the 1-based row. Arguments as
    :func:`read_jsonl`'s.

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
    return _table_examples(table.to_pylist(), table.column_names, path, prompt_field, answer_field, non_string_answers)


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
    answer_field: str | None = ANSWER,
    non_string_answers: NonStringAnswers = "error",
) -> list[SourceExample]:
    """Read a Hugging Face ``datasets`` folder written by ``save_to_disk`` (a Dataset or one split of a DatasetDict);
    ``split`` picks the split, the other arguments as :func:`read_jsonl`'s.

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
    return _table_examples(list(loaded), loaded.column_names, path, prompt_field, answer_field, non_string_answers)


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
