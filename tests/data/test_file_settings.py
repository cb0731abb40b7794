"""PromptDataModule settings wired for issue 10: the answer-type rule reaches the readers; a missing file is a
DataError and a wrong value a ConfigError, each naming the full flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.errors import ConfigError, DataError


def data(path: Path, **files: object) -> PromptDataModule:
    return PromptDataModule(
        source="jsonl", files={"train_path": str(path)} | files, splits={"val_size": 0}, tokenizer_path="builtin:maze"
    )


def test_non_string_answers_reaches_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"prompt": "WALL PATH", "answer": 3}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:1: .*answer"):
        data(path).setup("fit")
    module = data(path, non_string_answers="str")
    module.setup("fit")
    assert module.splits["train"][0].columns["answer"] == "3"


def test_bad_settings_are_user_errors_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="^--data.files.train_path does not exist"):
        data(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="^--data.files.non_string_answers must be one of"):
        data(tmp_path, non_string_answers="float")
