"""Tool schemas, tool-call parsing, calling tools and the tool messages the model reads.

References: hand-written schemas and parse results; the Hermes call format written out by hand.
"""

from __future__ import annotations

import time

import pytest

from lit_fgrpo.environments.faults import EnvironmentFault
from lit_fgrpo.environments.tools import (
    ToolCall,
    ToolCallError,
    ToolError,
    argument_error,
    error_message,
    parse_tool_calls,
    render_value,
    run_tool,
    tool_instructions,
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


def test_calls_in_the_hermes_format_are_parsed_in_order() -> None:
    text = (
        'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3.5}}</tool_call> and '
        '<tool_call>\n{"name": "lookup", "arguments": "{\\"key\\": \\"x\\"}"}\n</tool_call> done'
    )
    assert parse_tool_calls(text, SCHEMAS) == [
        ToolCall("add", {"a": 2, "b": 3.5}),
        ToolCall("lookup", {"key": "x"}),  # arguments as a JSON string (the OpenAI wire format) are accepted
    ]
    assert parse_tool_calls("The answer is 5.", SCHEMAS) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}',
            ToolCallError("malformed", "<tool_call> without </tool_call>"),
        ),
        ("<tool_call>add(1, 2)</tool_call>", ToolCallError("malformed", "not JSON (Expecting value at character 0)")),
        ('<tool_call>["add"]</tool_call>', ToolCallError("malformed", 'expected a JSON object with a "name" string')),
        (
            '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
            ToolCallError("malformed", '"arguments" must be a JSON object', "add"),
        ),
        (
            '<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>',
            ToolCallError("malformed", '"arguments" is a string that is not JSON', "add"),
        ),
        (
            '<tool_call>{"name": "divide", "arguments": {}}</tool_call>',
            ToolCallError("unknown_tool", "no tool named 'divide'", "divide"),
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
            ToolCallError("bad_arguments", "missing required argument 'b'", "add"),
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}</tool_call>',
            ToolCallError("bad_arguments", "unexpected argument 'c' (arguments: a, b)", "add"),
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": "1", "b": 2}}</tool_call>',
            ToolCallError("bad_arguments", "argument 'a' must be number, got \"1\"", "add"),
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": true, "b": 2}}</tool_call>',
            ToolCallError("bad_arguments", "argument 'a' must be number, got true", "add"),
        ),
    ],
)
def test_a_call_that_cannot_run_is_a_typed_error_never_an_exception(text: str, expected: ToolCallError) -> None:
    assert parse_tool_calls(text, SCHEMAS) == [expected]


def test_an_unclosed_call_before_a_good_one_spoils_only_itself() -> None:
    text = '<tool_call>{"name": "add"} <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    parsed = parse_tool_calls(text, SCHEMAS)
    assert [type(p) for p in parsed] == [ToolCallError, ToolCall]


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
    assert error_message(ToolCallError("malformed", "not JSON"), SCHEMAS) == (
        'error: malformed tool call: not JSON. Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'
    )


def test_a_tool_result_is_its_text_or_its_json() -> None:
    assert [render_value(v) for v in ("seven", 7, 7.5, [1, 2], {"a": None}, True)] == [
        "seven", "7", "7.5", "[1, 2]", '{"a": null}', "true"
    ]  # fmt: skip
    assert render_value({1, 2}) == "{1, 2}"  # not JSON-able: str()
    assert run_tool(Tools().add, ToolCall("add", {"a": 2, "b": 3}), None) == ("5", None)


def test_a_tool_error_is_shown_to_the_model_anything_else_is_a_fault() -> None:
    def rejects(a: float) -> float:
        raise ToolError("a must be positive")

    def breaks(a: float) -> float:
        raise KeyError("internal")

    text, error = run_tool(rejects, ToolCall("rejects", {"a": -1}), None)
    assert text == "error: rejects: a must be positive"
    assert error == ToolCallError("tool_error", "a must be positive", "rejects")
    with pytest.raises(EnvironmentFault, match=r"^tool 'breaks' raised KeyError: 'internal'$"):
        run_tool(breaks, ToolCall("breaks", {"a": 1}), 5.0)


def test_a_tool_past_its_timeout_is_a_fault() -> None:
    def slow(a: float) -> float:
        time.sleep(1.0)
        return a

    start = time.perf_counter()
    with pytest.raises(EnvironmentFault, match=r"^tool 'slow' timed out after 0.1 s$"):
        run_tool(slow, ToolCall("slow", {"a": 1}), 0.1)
    assert time.perf_counter() - start < 0.8


def test_the_instructions_list_every_schema_and_the_format() -> None:
    text = tool_instructions(SCHEMAS)
    assert '"name": "add"' in text and '"name": "lookup"' in text
    assert '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>' in text
