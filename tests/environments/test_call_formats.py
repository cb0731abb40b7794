"""Reading tool calls out of a reply, in each format, and the instructions that teach the format.

References: hand-written replies and the calls they hold; the formats written out by hand (Hermes' tags, Llama 3.1's
bare JSON); Python 3.11's own parser limits (nesting, integer digits), which must come back as a malformed call.
"""

from __future__ import annotations

import json

import pytest

from lit_fgrpo.environments.call_formats import TOOL_CALL_FORMATS, call_format, parse_tool_calls, tool_instructions
from lit_fgrpo.environments.tools import ToolCall, ToolCallError, error_message, tool_schema
from lit_fgrpo.errors import ConfigError
from tests.environments.test_tools import Tools  # the same two tools

SCHEMAS = [tool_schema(Tools().add, "Tools"), tool_schema(Tools().lookup, "Tools")]
HERMES_HINT = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'


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


def test_a_malformed_call_tells_the_model_how_its_format_writes_one() -> None:
    (error,) = parse_tool_calls("<tool_call>add(1, 2)</tool_call>", SCHEMAS)
    assert isinstance(error, ToolCallError)
    assert error_message(error, SCHEMAS) == (
        f"error: malformed tool call: not JSON (Expecting value at character 0). Write {HERMES_HINT}"
    )
    (error,) = parse_tool_calls("{add(1, 2)}", SCHEMAS, "llama3_json")
    assert isinstance(error, ToolCallError)
    assert error_message(error, SCHEMAS).endswith('Write {"name": "<tool>", "parameters": {...}} as the whole reply')


def test_calls_in_the_llama3_json_format_are_parsed_in_order() -> None:
    text = (
        '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "lookup", "arguments": {"key": "x"}}'
    )
    assert parse_tool_calls(text, SCHEMAS, "llama3_json") == [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("lookup", {"key": "x"}),  # "arguments" is read where "parameters" is missing
    ]
    two_lines = '{"name": "add", "parameters": {"a": 1, "b": 2}}\n{"name": "add", "parameters": {"a": 3, "b": 4}}\n'
    assert parse_tool_calls(two_lines, SCHEMAS, "llama3_json") == [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("add", {"a": 3, "b": 4}),
    ]
    assert parse_tool_calls("The answer is 5.", SCHEMAS, "llama3_json") == []  # not JSON first: no call
    assert parse_tool_calls('I would write {"name": "add"}', SCHEMAS, "llama3_json") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<|python_tag|>add(1, 2)", ToolCallError("malformed", "<|python_tag|> without a JSON object")),
        ('{"name": "add", "parameters": {"a": 1', ToolCallError("malformed", "not JSON (Expecting ',' delimiter at character 37)")),
        ('{"parameters": {}}', ToolCallError("malformed", 'expected a JSON object with a "name" string')),
        ('{"name": "add", "parameters": [1, 2]}', ToolCallError("malformed", '"parameters" must be a JSON object', "add")),
        ('{"name": "divide", "parameters": {}}', ToolCallError("unknown_tool", "no tool named 'divide'", "divide")),
        ('{"name": "add", "parameters": {"a": 1}}', ToolCallError("bad_arguments", "missing required argument 'b'", "add")),
    ],
)  # fmt: skip
def test_a_llama3_json_call_that_cannot_run_is_a_typed_error(text: str, expected: ToolCallError) -> None:
    assert parse_tool_calls(text, SCHEMAS, "llama3_json") == [expected]


def test_text_after_llama3_json_calls_is_a_malformed_call_after_the_good_ones() -> None:
    parsed = parse_tool_calls('{"name": "add", "parameters": {"a": 1, "b": 2}} so the sum is 3', SCHEMAS, "llama3_json")
    assert parsed[0] == ToolCall("add", {"a": 1, "b": 2})
    assert isinstance(parsed[1], ToolCallError) and parsed[1].kind == "malformed"


def deeply_nested_call(format_name: str) -> str:
    """A call whose argument nests 5,000 lists: Python's JSON parser raises RecursionError at about 1,000."""
    value = "[" * 5000 + "]" * 5000
    if format_name == "hermes":
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {value}, "b": 1}}}}</tool_call>'
    return f'{{"name": "add", "parameters": {{"a": {value}, "b": 1}}}}'


def long_integer_call(format_name: str) -> str:
    """A call with a 5,000-digit integer: Python 3.11's parser raises ValueError above 4,300 digits."""
    if format_name == "hermes":
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {"7" * 5000}, "b": 1}}}}</tool_call>'
    return f'{{"name": "add", "parameters": {{"a": {"7" * 5000}, "b": 1}}}}'


@pytest.mark.parametrize("format_name", TOOL_CALL_FORMATS)
def test_json_that_pythons_parser_refuses_is_a_malformed_call_never_an_exception(format_name: str) -> None:
    with pytest.raises(RecursionError):  # the reference: what json.loads itself does with the deep call
        json.loads("[" * 5000 + "]" * 5000)
    with pytest.raises(ValueError, match="digits"):
        json.loads("7" * 5000)
    fmt = call_format(format_name)  # type: ignore[arg-type]
    assert fmt.parse(deeply_nested_call(format_name), SCHEMAS) == [
        ToolCallError("malformed", "not JSON (nested too deeply)")
    ]
    assert fmt.parse(long_integer_call(format_name), SCHEMAS) == [
        ToolCallError("malformed", "not JSON (a number with too many digits)")
    ]
    # arguments as a JSON string (the OpenAI wire format) are parsed a second time, guarded the same way
    nested_in_string = json.dumps({"name": "add", "arguments": "[" * 5000 + "]" * 5000})
    text = f"<tool_call>{nested_in_string}</tool_call>" if format_name == "hermes" else nested_in_string
    assert fmt.parse(text, SCHEMAS) == [ToolCallError("malformed", '"arguments" is a string that is not JSON', "add")]


@pytest.mark.parametrize("format_name", TOOL_CALL_FORMATS)
def test_the_instructions_list_every_schema_and_a_call_written_their_way_parses_back(format_name: str) -> None:
    fmt = call_format(format_name)  # type: ignore[arg-type]
    text = fmt.instructions(SCHEMAS)
    for schema in SCHEMAS:
        assert json.dumps(schema) in text
    call = ToolCall("add", {"a": 12, "b": 7})
    assert fmt.parse(fmt.write(call), SCHEMAS) == [call]
    assert fmt.parse(f"{fmt.write(call)}\n{fmt.write(ToolCall('lookup', {'key': 'w'}))}", SCHEMAS) == [
        call,
        ToolCall("lookup", {"key": "w"}),
    ]
    assert tool_instructions(SCHEMAS, format_name) == text  # type: ignore[arg-type]


def test_the_instructions_show_each_formats_own_syntax() -> None:
    assert '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>' in tool_instructions(
        SCHEMAS
    )
    assert '{"name": <function-name>, "parameters": <args-json-object>}' in tool_instructions(SCHEMAS, "llama3_json")


def test_an_unknown_format_is_one_line_naming_the_setting() -> None:
    with pytest.raises(
        ConfigError, match=r"^--rollout\.tool_call_format must be one of hermes, llama3_json; got 'xml'$"
    ):
        call_format("xml")
