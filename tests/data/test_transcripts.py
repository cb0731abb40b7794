"""Transcript files and generators: JSONL and Parquet read alike, every bad row named by file and row or counted.

References: the rows as written, and :func:`render_transcript` of the same messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lit_fgrpo.data.transcripts import (
    generated_transcripts,
    question_key,
    read_transcripts,
    tokenize_transcripts,
)
from lit_fgrpo.environments import ChatTurns, load_environment
from lit_fgrpo.environments.calculator_transcripts import multiplication_transcripts
from lit_fgrpo.environments.transcripts import render_transcript
from lit_fgrpo.errors import ConfigError, DataError
from tests.environments.tiny_chat import chat_tokenizer


def turns() -> ChatTurns:
    return ChatTurns(chat_tokenizer(), tools=load_environment("calculator").tool_schemas())


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def broken_call(row: dict[str, Any]) -> dict[str, Any]:
    messages = [dict(m) for m in row["messages"]]
    messages[1]["content"] = "<tool_call>{not json}</tool_call>"
    return {"messages": messages}


def test_jsonl_and_parquet_give_the_same_transcripts(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = multiplication_transcripts(4, seed=2)
    jsonl = write_jsonl(tmp_path / "t.jsonl", rows)
    parquet = tmp_path / "t.parquet"
    pq.write_table(pyarrow.Table.from_pylist(rows), parquet)  # struct fields: `name` is null where absent
    from_jsonl, from_parquet = read_transcripts(jsonl), read_transcripts(parquet)
    assert [r.where for r in from_parquet] == [f"{parquet}: row {i}" for i in range(1, 5)]
    chat = turns()
    expected = [render_transcript(chat, r["messages"]) for r in rows]
    assert tokenize_transcripts(from_jsonl, chat).examples == expected
    assert tokenize_transcripts(from_parquet, chat).examples == expected


def test_a_bad_row_is_one_line_naming_file_and_line_or_a_counted_skip(tmp_path: Path) -> None:
    rows = multiplication_transcripts(5, seed=4)
    rows[2] = broken_call(rows[2])
    rows[3]["messages"][0]["role"] = "narrator"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))  # a blank line 2
    read = read_transcripts(path)
    with pytest.raises(DataError) as info:
        tokenize_transcripts(read, turns())
    assert str(info.value).startswith(f"{path}:4: message 2 (assistant): a tool call does not parse: ")
    assert "\n" not in str(info.value)
    kept = tokenize_transcripts(read, turns(), bad_rows="skip")
    assert len(kept.examples) == 3 and dict(kept.skipped) == {"tool_call": 1, "role": 1}
    assert kept.first_skip is not None and kept.first_skip.startswith(f"{path}:4: ")
    shortest = min(len(e.ids) for e in kept.examples)
    too_long = tokenize_transcripts(read, turns(), max_length=shortest, bad_rows="skip")
    assert len(too_long.examples) == sum(len(e.ids) == shortest for e in kept.examples)
    assert too_long.skipped["too_long"] == 3 - len(too_long.examples)
    with pytest.raises(DataError, match="no usable transcript among 5 .*'too_long': 3"):
        tokenize_transcripts(read, turns(), max_length=shortest - 1, bad_rows="skip")


def test_unreadable_files_and_rows_are_errors_naming_them(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such transcript file"):
        read_transcripts(tmp_path / "missing.jsonl")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"messages": []}\n{oops\n')
    with pytest.raises(DataError, match=f"{bad_json}:2: malformed JSON"):
        read_transcripts(bad_json)
    no_field = write_jsonl(tmp_path / "nofield.jsonl", [{"conversation": []}])
    with pytest.raises(DataError, match=f"{no_field}:1: missing field 'messages'"):
        read_transcripts(no_field)
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    with pytest.raises(DataError, match="not a Parquet file"):
        read_transcripts(fake)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no transcripts"):
        read_transcripts(empty)


def test_held_out_questions_are_left_out_whatever_the_policy(tmp_path: Path) -> None:
    rows = multiplication_transcripts(6, seed=5)
    read = read_transcripts(write_jsonl(tmp_path / "t.jsonl", rows))
    held = {question_key(rows[1]["messages"]), question_key(rows[4]["messages"])}
    kept = tokenize_transcripts(read, turns(), held_out=held)
    assert len(kept.examples) == 4 and dict(kept.skipped) == {"held_out": 2}


def fixed_transcripts(count: int, records: list[Any] | None = None) -> list[dict[str, Any]]:
    """A generator for the test below: ``count`` transcripts, plus one per record when given them."""
    return multiplication_transcripts(count + len(records or []), seed=6)


def no_records(count: int) -> list[list[dict[str, Any]]]:
    """A generator that returns the message lists themselves."""
    return [r["messages"] for r in multiplication_transcripts(count, seed=6)]


def test_a_generator_is_called_with_its_arguments_and_the_training_records() -> None:
    target = f"{__name__}:fixed_transcripts"
    rows = generated_transcripts(target, {"count": 2}, records=["r1", "r2"])
    assert [r.where for r in rows] == [f"{target}: transcript {i}" for i in (1, 2, 3, 4)]
    plain = generated_transcripts(f"{__name__}:no_records", {"count": 2}, records=["ignored"])
    assert [r.messages for r in plain] == [r.messages for r in rows[:2]]
    with pytest.raises(ConfigError, match="G.generator 'nowhere:fn' does not import"):
        generated_transcripts("nowhere:fn", {}, [], flag="G.generator")
    with pytest.raises(ConfigError, match="does not take its arguments \\['size'\\]"):
        generated_transcripts(target, {"size": 2}, [], flag="G.generator")
    with pytest.raises(ConfigError, match="made no transcripts"):
        generated_transcripts(target, {"count": 0}, [], flag="G.generator")
