"""Chat transcripts for the supervised warm start: read from JSONL or Parquet, or made by a generator, then tokenised
as episodes (:func:`~lit_fgrpo.environments.transcripts.render_transcript`).

A file holds one transcript per row in a ``messages`` field (TRL's conversational format)::

    {"messages": [{"role": "user", "content": "What is 12 * 34? ..."},
                  {"role": "assistant", "content": "<tool_call>{\\"name\\": \\"multiply\\", ...}</tool_call>"},
                  {"role": "tool", "name": "multiply", "content": "408"},
                  {"role": "assistant", "content": "408"}]}

Every problem names its row: ``data/calc.jsonl:7: message 2 (assistant): a tool call does not parse: ...`` (JSONL:
the 1-based line; Parquet: ``file: row 7``; a generator: ``module:function: transcript 7``). A file that cannot be
read is always an error; a bad row is one too under ``bad_rows="error"`` (the default), or a skip counted by kind
(``role``, ``tool_call``, ``layout``, ``too_long``) under ``"skip"``, logged with the first example.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lit_fgrpo.data.sources import check_parquet_file
from lit_fgrpo.environments.transcripts import TranscriptError, TranscriptTokens, render_transcript
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BadRows = Literal["error", "skip"]
"""A transcript no episode could produce: ``"error"`` stops with one line naming its file and row; ``"skip"`` drops
it and counts it by kind."""

PARQUET_SUFFIXES = (".parquet", ".pq")
"""File suffixes read as Parquet; anything else is read as JSONL."""


@dataclass(frozen=True)
class TranscriptRow:
    """One transcript as read, before tokenisation."""

    where: str
    """``file:line``, ``file: row N`` or ``generator: transcript N``: what a problem with it names."""
    messages: Any
    """The row's ``messages`` value, as read (checked when tokenised)."""


@dataclass
class TokenizedTranscripts:
    """The transcripts that render, and what was left out."""

    examples: list[TranscriptTokens] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Kind -> transcripts left out (the problem kinds, and ``held_out`` for a held-out question)."""
    first_skip: str | None = None
    """The first skipped row's one-line problem, for the log."""


def _row_messages(row: Any, where: str, field_name: str) -> Any:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if field_name not in row:
        raise DataError(f"{where}: missing field {field_name!r} (present: {sorted(row)})")
    return row[field_name]


def read_jsonl_transcripts(path: Path, field_name: str = "messages") -> list[TranscriptRow]:
    """One JSON object per line (blank lines ignored); each problem names the 1-based line."""
    rows = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: malformed JSON ({err.msg}, column {err.colno})") from None
            rows.append(TranscriptRow(where, _row_messages(row, where, field_name)))
    return rows


def read_parquet_transcripts(path: Path, field_name: str = "messages") -> list[TranscriptRow]:
    """A Parquet table with a ``messages`` column (a list of structs); each problem names the 1-based row."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from err
    check_parquet_file(path)
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow's ArrowInvalid / OSError for a damaged file
        raise DataError(f"{path}: unreadable Parquet file ({type(err).__name__}: {err})") from None
    if field_name not in table.column_names:
        raise DataError(f"{path}: missing column {field_name!r} (present: {table.column_names})")
    return [TranscriptRow(f"{path}: row {i}", value) for i, value in enumerate(table.column(field_name).to_pylist(), 1)]


def read_transcripts(path: str | Path, field_name: str = "messages") -> list[TranscriptRow]:
    """The transcripts of a JSONL or Parquet file (by suffix: :data:`PARQUET_SUFFIXES`).

    Raises:
        DataError: If the file is missing, unreadable, empty, or a row is not an object with the field.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such transcript file")
    reader = read_parquet_transcripts if path.suffix.lower() in PARQUET_SUFFIXES else read_jsonl_transcripts
    rows = reader(path, field_name)
    if not rows:
        raise DataError(f"{path}: no transcripts")
    return rows


def load_generator(target: str, flag: str) -> Callable[..., Any]:
    """``package.module:function`` (or ``package.module.function``), imported.

    Raises:
        ConfigError: Naming ``flag`` when it does not import or is not callable.
    """
    module_name, sep, attr = target.partition(":") if ":" in target else target.rpartition(".")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{flag} {target!r}: expected 'package.module:function'")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except Exception as err:  # ImportError, AttributeError, or whatever the module raises while it runs
        raise ConfigError(f"{flag} {target!r} does not import: {type(err).__name__}: {err}") from None
    if not callable(function):
        raise ConfigError(f"{flag} {target!r} is a {type(function).__name__}, not a function")
    return function  # type: ignore[no-any-return]


def generated_transcripts(
    target: str, args: Mapping[str, Any], records: Sequence[Any], flag: str = "generator"
) -> list[TranscriptRow]:
    """Transcripts made by a generator: ``function(**args)``, plus ``records=`` (the run's training records) when it
    takes a parameter of that name; it returns ``{"messages": [...]}`` rows (or the message lists themselves).

    Raises:
        ConfigError: Naming ``flag`` when the generator does not import, does not take ``args``, or returns nothing.
    """
    function = load_generator(target, flag)
    kwargs = dict(args)
    if "records" in inspect.signature(function).parameters:
        kwargs["records"] = list(records)
    try:
        made = list(function(**kwargs))
    except TypeError as err:
        raise ConfigError(f"{flag} {target!r} does not take its arguments {sorted(args)}: {err}") from None
    if not made:
        raise ConfigError(f"{flag} {target!r} made no transcripts")
    return [
        TranscriptRow(f"{target}: transcript {i}", row.get("messages") if isinstance(row, Mapping) else row)
        for i, row in enumerate(made, start=1)
    ]


def question_key(messages: Any) -> tuple[str, ...]:
    """The user turns before the first assistant reply: what makes two prompts the same question."""
    key = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, Mapping) or message.get("role") == "assistant":
            break
        if message.get("role") == "user":
            key.append(str(message.get("content")))
    return tuple(key)


def tokenize_transcripts(
    rows: Sequence[TranscriptRow],
    turns: ChatTurns,
    max_length: int | None = None,
    bad_rows: BadRows = "error",
    held_out: Collection[tuple[str, ...]] = (),
) -> TokenizedTranscripts:
    """Each transcript's tokens as an episode's (:func:`render_transcript`), with the bad-row policy.

    Args:
        rows: The transcripts (:func:`read_transcripts`, :func:`generated_transcripts`).
        turns: The episodes' chat turns (tokenizer, tools).
        max_length: The context in tokens (``None``: no limit).
        bad_rows: See :data:`BadRows`.
        held_out: :func:`question_key` of the held-out prompts: a transcript asking one of them is left out (and
            counted as ``held_out``), whatever ``bad_rows`` says, so the warm start never sees a test question.

    Raises:
        DataError: ``"<where>: <problem>"`` for the first bad row under ``"error"``, or when none is left.
    """
    out = TokenizedTranscripts()
    held = set(held_out)
    for row in rows:
        if held and question_key(row.messages) in held:
            out.skipped["held_out"] += 1
            continue
        try:
            out.examples.append(render_transcript(turns, row.messages, max_length))
        except TranscriptError as err:
            if bad_rows == "error":
                raise DataError(f"{row.where}: {err}") from None
            out.skipped[err.kind] += 1
            out.first_skip = out.first_skip or f"{row.where}: {err}"
    if out.skipped:
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(out.skipped.items()))
        log.warning(
            "transcripts: skipped %d of %d (%s); first: %s", out.skipped.total(), len(rows), counts, out.first_skip
        )
    if not out.examples:
        raise DataError(
            f"no usable transcript among {len(rows)} (skipped: {dict(out.skipped)}; first: {out.first_skip})"
        )
    return out


__all__ = [
    "BadRows",
    "TokenizedTranscripts",
    "TranscriptRow",
    "generated_transcripts",
    "load_generator",
    "question_key",
    "read_transcripts",
    "tokenize_transcripts",
]
