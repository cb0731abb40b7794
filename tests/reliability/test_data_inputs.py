"""Group 2: every reader names what it read (file and line or row, the field, the expected type)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lit_fgrpo.data.sources import read_disk_dataset, read_jsonl, read_parquet
from lit_fgrpo.errors import DataError


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


GOOD = json.dumps({"prompt": "p", "answer": "1"})

# (name, file bytes, the exact message after "<path>:")
JSONL_CASES = [
    (
        "latin1",
        (GOOD + "\n" + '{"prompt": "caf\xe9", "answer": "1"}\n').encode("latin-1"),
        "2: not UTF-8 (byte 0xe9 at column 16)",
    ),
    ("bom_in_middle", (GOOD + "\n").encode() + b"\xff\xfe\n", "2: not UTF-8 (byte 0xff at column 1)"),
    (
        "duplicate_key",
        (GOOD + '\n{"prompt": "a", "answer": "1", "answer": "2"}\n').encode(),
        "2: duplicate key 'answer' in one JSON object",
    ),
    (
        "nested_duplicate",
        b'{"prompt": "a", "answer": "1", "meta": {"k": 1, "k": 2}}\n',
        "1: duplicate key 'k' in one JSON object",
    ),
    ("answer_list", b'{"prompt": "a", "answer": [1, 2]}\n', "1: field 'answer' must be a string, got list [1, 2]"),
    ("answer_int", b'{"prompt": "a", "answer": 3}\n', "1: field 'answer' must be a string, got int 3"),
    ("answer_float", b'{"prompt": "a", "answer": 0.1}\n', "1: field 'answer' must be a string, got float 0.1"),
    ("answer_bool", b'{"prompt": "a", "answer": true}\n', "1: field 'answer' must be a string, got bool True"),
    ("answer_dict", b'{"prompt": "a", "answer": {"x": 1}}\n', "1: field 'answer' must be a string, got dict {'x': 1}"),
    (
        "prompt_number",
        b'{"prompt": 5, "answer": "1"}\n',
        "1: field 'prompt' must be a string or a list of chat messages, got int",
    ),
    ("top_level_list", b"[1, 2]\n", "1: expected a JSON object, got list"),
    (
        "answer_null",
        b'{"prompt": "a", "answer": null}\n',
        "1: missing field(s) ['answer'] (present: ['answer', 'prompt'])",
    ),
    (
        "truncated_line",
        (GOOD + '\n{"prompt": "a", "ans').encode(),
        "2: malformed JSON (Unterminated string starting at, column 17)",
    ),
]


@pytest.mark.parametrize(("name", "content", "expected"), JSONL_CASES, ids=[c[0] for c in JSONL_CASES])
def test_jsonl_reader_names_file_line_and_problem(tmp_path: Path, name: str, content: bytes, expected: str) -> None:
    path = write(tmp_path / f"{name}.jsonl", content)
    with pytest.raises(DataError) as info:
        read_jsonl(path)
    assert str(info.value) == f"{path}:{expected}"


def test_numbers_converted_by_the_documented_rule_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "n.jsonl", '{"prompt": "a", "answer": 3}\n{"prompt": "b", "answer": 0.5}\n' + GOOD + "\n")
    with caplog.at_level(logging.WARNING):
        examples = read_jsonl(path, non_string_answers="str")
    assert [e.columns["answer"] for e in examples] == ["3", "0.5", "1"]
    assert f"{path}: converted 2 non-string value(s) of ['answer'] to strings with str()" in caplog.text
    with pytest.raises(DataError, match="got list"):  # lists are never converted
        read_jsonl(write(tmp_path / "l.jsonl", '{"prompt": "a", "answer": [3]}\n'), non_string_answers="str")


def test_text_file_is_not_parquet(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", GOOD + "\n")
    with pytest.raises(DataError) as info:
        read_parquet(path)
    assert str(info.value) == f"{path}: not a Parquet file (no PAR1 magic at its start and end; {len(GOOD) + 1} bytes)"


def test_truncated_parquet_is_refused_by_name(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), good)
    cut = write(tmp_path / "cut.parquet", good.read_bytes()[:-20])
    with pytest.raises(DataError, match=rf"^{cut}: not a Parquet file \(no PAR1 magic"):
        read_parquet(cut)


def test_parquet_numeric_answer_names_the_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "num.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [1, 2]}), path)
    with pytest.raises(DataError) as info:
        read_parquet(path)
    assert str(info.value) == f"{path}: row 1: field 'answer' must be a string, got int 1"


def test_datasets_path_that_is_a_file_or_a_plain_folder(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    file = write(tmp_path / "data.jsonl", GOOD + "\n")
    with pytest.raises(DataError) as info:
        read_disk_dataset(file, "train")
    assert str(info.value) == f"{file}: not a datasets folder (a file; source='disk' wants a save_to_disk folder)"
    folder = tmp_path / "plain"
    folder.mkdir()
    with pytest.raises(DataError, match=rf"^{folder}: not a datasets folder \(none of"):
        read_disk_dataset(folder, "train")
    with pytest.raises(FileNotFoundError, match="no such datasets folder"):
        read_disk_dataset(tmp_path / "absent", "train")
