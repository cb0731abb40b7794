"""The file sources' answer rule (issue 47): ``--data.files.answer_field null`` requires no answer, and a row's own
columns reach the records with the file's types; only the ``answer`` alias is a string."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from lit_fgrpo.data import PromptDataModule, read_disk_dataset, read_jsonl, read_parquet
from lit_fgrpo.errors import DataError


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def data(path: Path, source: str = "jsonl", **files: Any) -> PromptDataModule:
    module = PromptDataModule(
        source=source, files={"train_path": str(path)} | files, splits={"val_size": 0}, tokenizer_path="builtin:maze"
    )
    module.setup("fit")
    return module


ROWS = [
    {"prompt": "WALL PATH", "start": 3, "moves": [1, 2], "meta": {"level": 2}},
    {"prompt": "PATH", "start": 0, "moves": [], "meta": {"level": 1}},
]
"""TRL-shaped rows: what ``reset(**row)`` reads, and no answer."""


# ---------------------------------------------------------------------------------------------- answer_field null


def test_no_answer_field_reads_rows_without_an_answer_as_they_are(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "env.jsonl", ROWS)
    examples = read_jsonl(path, answer_field=None)
    assert [e.columns for e in examples] == [{k: v for k, v in row.items() if k != "prompt"} for row in ROWS]
    records = data(path, answer_field=None).splits["train"]
    assert [r.columns for r in records] == [e.columns for e in examples]
    assert all("answer" not in r.columns for r in records)


def test_no_answer_field_keeps_an_answer_column_unconverted(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "env.jsonl", [{"prompt": "PATH", "answer": 7}, {"prompt": "WALL"}])
    assert [e.columns for e in read_jsonl(path, answer_field=None)] == [{"answer": 7}, {}]


def test_a_missing_answer_names_the_row_and_the_flag(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "PATH", "answer": "1"}, {"prompt": "WALL"}])
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing field\(s\) \['answer'\]") as caught:
        data(path)
    assert "--data.files.answer_field" in str(caught.value.hint) and "\n" not in str(caught.value)
    with pytest.raises(DataError) as caught:  # a prompt that is missing is not the answer's business
        read_jsonl(write_jsonl(tmp_path / "p.jsonl", [{"answer": "1"}]), answer_field=None)
    assert caught.value.hint is None


def test_parquet_without_an_answer_column(tmp_path: Path) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "env.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "start": [3, 0]}), path)
    with pytest.raises(DataError, match=r"missing column\(s\) \['answer'\]") as caught:
        read_parquet(path)
    assert "--data.files.answer_field" in str(caught.value.hint)
    assert [e.columns for e in read_parquet(path, answer_field=None)] == [{"start": 3}, {"start": 0}]


def test_disk_folder_without_an_answer_column(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"prompt": ["a"], "start": [3], "moves": [[1, 2]]}).save_to_disk(str(tmp_path / "ds"))
    [example] = read_disk_dataset(tmp_path / "ds", "train", answer_field=None)
    assert example.columns == {"start": 3, "moves": [1, 2]}


# ------------------------------------------------------------------------------------- another column as the answer


def test_an_int_answer_column_keeps_its_type_and_only_the_alias_is_a_string(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "env.jsonl", ROWS)
    records = data(path, answer_field="start", non_string_answers="str").splits["train"]
    assert [r.columns["start"] for r in records] == [3, 0]
    assert all(type(r.columns["start"]) is int for r in records)  # reset(start=3) compares ints, not "3"
    assert [r.columns["answer"] for r in records] == ["3", "0"]
    assert records[0].columns["moves"] == [1, 2] and records[0].columns["meta"] == {"level": 2}


def test_list_columns_keep_their_type_beside_the_answer(tmp_path: Path) -> None:
    rows = [row | {"target": "DONE"} for row in ROWS]
    records = data(write_jsonl(tmp_path / "env.jsonl", rows), answer_field="target").splits["train"]
    assert [r.columns["moves"] for r in records] == [[1, 2], []]
    assert [r.columns["answer"] for r in records] == ["DONE", "DONE"] and records[0].columns["target"] == "DONE"


def test_a_list_as_the_answer_is_refused_by_name(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "env.jsonl", ROWS)
    with pytest.raises(DataError, match=rf"^{path}:1: field 'moves' must be a string, got list \[1, 2\]$") as caught:
        data(path, answer_field="moves", non_string_answers="str")
    assert "--data.files.answer_field null" in str(caught.value.hint)


def test_an_int_answer_under_the_default_rule_is_refused_by_name(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "env.jsonl", ROWS)
    with pytest.raises(DataError, match=rf"^{path}:1: field 'start' must be a string, got int 3$"):
        data(path, answer_field="start")


def test_parquet_int_column_keeps_its_type(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "env.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "start": [3, 0], "moves": [[1, 2], []]}), path)
    with caplog.at_level(logging.WARNING):
        examples = read_parquet(path, answer_field="start", non_string_answers="str")
    assert [e.columns for e in examples] == [
        {"start": 3, "moves": [1, 2], "answer": "3"},
        {"start": 0, "moves": [], "answer": "0"},
    ]
    assert f"{path}: converted 2 non-string value(s) of ['start'] to strings with str()" in caplog.text


def test_the_default_answer_column_is_still_converted_in_place(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "PATH", "answer": 3, "start": 3}])
    [record] = data(path, non_string_answers="str").splits["train"]
    assert record.columns == {"answer": "3", "start": 3}
