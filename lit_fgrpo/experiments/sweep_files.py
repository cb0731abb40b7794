"""Checked readers of the sweep's own files: the results CSVs and the JSON state, each error naming file and line.

The sweep writes these files atomically, but a user copies, edits, merges and truncates them; a report or a resume
that reads one must say which file and which line is wrong rather than end in a ``KeyError`` or ``TypeError``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.errors import DataError

SWEEP_COLUMNS = ("seed", "group_size", "gamma", "rl_steps")
"""Columns every sweep row has; the reports also need at least one ``pass_at_*`` column."""
NUMERIC_COLUMNS = ("seed", "group_size", "gamma", "rl_steps")
METRIC_PREFIXES = ("pass_at_", "base_pass_at_", "dnll")
"""Columns of numbers: a cell may be empty (a row written before the column existed) but not text."""


def number(value: str | None) -> Any:
    """An integer cell as int, another numeric cell as float, anything else unchanged."""
    for kind in (int, float):
        try:
            return kind(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass
    return value


def read_table(path: str | Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Read a sweep CSV, refusing a file that is not one (empty, cut short, a column missing, a non-number).

    Args:
        path: The CSV file.
        required: Columns the caller reads; they must be present and (except ``method``) hold numbers in every row,
            as must :data:`NUMERIC_COLUMNS`; metric columns (:data:`METRIC_PREFIXES`) hold numbers or nothing.

    Returns:
        One dict per row, numeric cells as ints or floats.

    Raises:
        DataError: ``"<path>:<line>: ..."`` naming the problem.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 CSV file") from None
    if not text.strip():
        raise DataError(f"{path}: empty file (expected a header line with {', '.join(SWEEP_COLUMNS)})")
    reader = csv.reader(text.splitlines())
    header = next(reader)
    missing = [column for column in required if column not in header]
    if missing:
        raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (the header has: {', '.join(header)})")
    rows: list[dict[str, Any]] = []
    for cells in reader:
        line = reader.line_num
        if not cells:
            continue
        if len(cells) != len(header):
            raise DataError(
                f"{path}:{line}: {len(cells)} fields where the header has {len(header)} (a truncated or edited file?)"
            )
        row = {key: number(value) for key, value in zip(header, cells)}
        for column, value in row.items():
            must = column in NUMERIC_COLUMNS or (column in required and column != "method")
            if (must or (column.startswith(METRIC_PREFIXES) and value != "")) and not isinstance(value, int | float):
                raise DataError(f"{path}:{line}: column {column} must be a number, got {value!r}")
        rows.append(row)
    return rows


def read_state(path: Path) -> dict[str, Any]:
    """A JSON object written by the sweep, ``{}`` when absent; a broken one names the file, line and column.

    Raises:
        DataError: the file is not JSON or its top level is not an object.
    """
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); a truncated file?",
            hint="the sweep rewrites this file atomically: restore it, or delete it to recompute what it held",
        ) from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data
