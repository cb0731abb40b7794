"""Tool schemas, checking a call's arguments, and the tool messages the model reads.

References: hand-written schemas and messages; the JSON the model would read, written out by hand. Reading calls out
of a reply is tests/environments/test_call_formats.py's.
"""

from __future__ import annotations

import pytest

from lit_fgrpo.environments.tools import (
    MAX_RENDER_DEPTH,
    ToolCallError,
    argument_error,
    error_message,
    render_value,
    tool_schema,
)
from lit_fgrpo.errors import ConfigError


class Tools:
    def add(self, a: float, b: float) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    def lookup(self, key: str, exact: bool = True) -> str:
        """Look a word up.

        Args:
            key: The word.
            exact: Whether to match it exactly.
        """
        return key.upper() if exact else key

    def undocumented(self, x: int) -> int:
        return x


SCHEMAS = [tool_schema(Tools().add, "Tools"), tool_schema(Tools().lookup, "Tools")]


def test_a_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    assert SCHEMAS[0] == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "description": "The first number."},
                    "b": {"type": "number", "description": "The second number."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "number"},
        },
    }
    assert SCHEMAS[1]["function"]["parameters"]["required"] == ["key"]


def test_a_tool_without_a_docstring_is_one_line_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^tool Tools\.undocumented needs a type hint and a docstring") as err:
        tool_schema(Tools().undocumented, "Tools")
    assert "\n" not in str(err.value)


def test_argument_types_follow_json() -> None:
    parameters = SCHEMAS[1]["function"]["parameters"]
    assert argument_error({"key": "w"}, parameters) is None
    assert argument_error({"key": "w", "exact": 1}, parameters) == "argument 'exact' must be boolean, got 1"


def test_error_messages_say_what_was_wrong_and_how_to_call() -> None:
    assert error_message(ToolCallError("unknown_tool", "no tool named 'divide'", "divide"), SCHEMAS) == (
        "error: unknown tool 'divide'; the tools are: add, lookup"
    )
    assert error_message(ToolCallError("bad_arguments", "missing required argument 'b'", "add"), SCHEMAS) == (
        "error: bad arguments for 'add': missing required argument 'b'"
    )
    hint = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'  # the run's format says how to write one
    assert error_message(ToolCallError("malformed", "not JSON", hint=hint), SCHEMAS) == (
        f"error: malformed tool call: not JSON. Write {hint}"
    )
    assert error_message(ToolCallError("malformed", "not JSON"), SCHEMAS) == "error: malformed tool call: not JSON."


def test_a_tool_result_is_its_text_or_its_json() -> None:
    assert [render_value(v) for v in ("seven", 7, 7.5, [1, 2], {"a": None}, True)] == [
        "seven", "7", "7.5", "[1, 2]", '{"a": null}', "true"
    ]  # fmt: skip
    assert render_value({1, 2}) == "{1, 2}"  # not JSON-able: str()


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_tool_result_that_cannot_be_written_out_is_a_placeholder_never_an_exception() -> None:
    deep: list[object] = []
    for _ in range(5000):  # JSON and str() would recurse 5,000 levels
        deep = [deep]
    assert render_value(deep) == f"<list nested deeper than {MAX_RENDER_DEPTH} levels>"
    shallow: list[object] = []
    for _ in range(MAX_RENDER_DEPTH - 1):
        shallow = [shallow]
    assert render_value(shallow) == "[" * MAX_RENDER_DEPTH + "]" * MAX_RENDER_DEPTH
    huge = 10**5000  # json.dumps and str() both refuse an int of more than 4,300 digits (Python 3.11)
    assert render_value(huge) == "<int that cannot be shown as text>"
    assert render_value(Unprintable()) == "<Unprintable that cannot be shown as text>"
    cycle: list[object] = [1]
    cycle.append(cycle)
    assert render_value(cycle) == "[1, [...]]"  # JSON refuses the cycle, str() writes it


def test_a_value_of_the_wrong_type_is_shown_short() -> None:
    parameters = SCHEMAS[0]["function"]["parameters"]
    problem = argument_error({"a": "x" * 500, "b": 1}, parameters)
    assert problem == f"argument 'a' must be number, got \"{'x' * 79}... (502 characters)"
