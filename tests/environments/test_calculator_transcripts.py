"""The calculator's transcript generator: correct calls and answers made by the environment, no model (issue 49).

References: Python's own products and sums, the ``arithmetic`` source's question text, the calculator's tool schema
(every generated call parses against it) and the JSONL reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lit_fgrpo.data.transcripts import read_transcripts
from lit_fgrpo.environments import ChatTurns, load_environment
from lit_fgrpo.environments.calculator_transcripts import (
    INSTRUCTION,
    calculator_transcripts,
    main,
    multiplication_transcripts,
    parse_expression,
)
from lit_fgrpo.environments.transcripts import read_calls
from tests.environments.tiny_chat import chat_tokenizer


def test_multiplication_transcripts_call_the_tool_right_and_answer_with_its_result() -> None:
    rows = multiplication_transcripts(64, min_value=10, max_value=999, seed=3, system_prompt="Be brief.")
    turns = ChatTurns(chat_tokenizer(), tools=load_environment("calculator").tool_schemas())
    questions = set()
    for row in rows:
        system, user, call, tool, answer = row["messages"]
        assert system == {"role": "system", "content": "Be brief."}
        a, b = (int(x) for x in user["content"].removeprefix("What is ").split("?")[0].split(" * "))
        assert 10 <= a <= 999 and 10 <= b <= 999
        assert user["content"] == f"What is {a} * {b}? {INSTRUCTION}"
        (parsed,) = read_calls(turns, call["content"])
        assert (parsed.name, parsed.arguments) == ("multiply", {"a": a, "b": b})
        assert tool == {"role": "tool", "name": "multiply", "content": str(a * b)}
        assert answer == {"role": "assistant", "content": str(a * b)}
        questions.add((a, b))
    assert len(questions) == 64  # distinct
    assert multiplication_transcripts(64, seed=3, system_prompt="Be brief.") == rows  # seeded


def test_transcripts_of_a_runs_records_keep_their_prompt_and_skip_what_the_calculator_cannot_do() -> None:
    prompt = [{"role": "user", "content": "What is 12 + 30? Use a tool."}]
    records = [
        SimpleNamespace(messages=prompt, columns={"expression": "12 + 30"}),
        SimpleNamespace(messages=prompt, columns={"expression": "1 + 2 * 3"}),  # two operations: skipped
        SimpleNamespace(messages=None, columns={"expression": "2 * 3"}),  # no chat messages: skipped
    ]
    (row,) = calculator_transcripts(records)
    assert row["messages"][0] == prompt[0]
    assert row["messages"][2] == {"role": "tool", "name": "add", "content": "42"}
    assert calculator_transcripts(records * 5, limit=2) == [row, row]
    assert parse_expression("123 * 45") == (123, "*", 45) and parse_expression("7 - 2") is None


def test_the_command_writes_jsonl_the_warm_start_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calc.jsonl"
    assert main(["--out", str(out), "--count", "5", "--seed", "1"]) == 0
    assert "wrote 5 transcripts" in capsys.readouterr().out
    rows = read_transcripts(out)
    assert [r.where for r in rows] == [f"{out}:{i}" for i in range(1, 6)]
    assert [{"messages": r.messages} for r in rows] == multiplication_transcripts(5, seed=1)
    assert json.loads(out.read_text().splitlines()[0])["messages"][1]["role"] == "assistant"
    assert main(["--out", str(out), "--count", "5", "--min-value", "3", "--max-value", "3"]) == 2
