"""Tool-call formats: how the model writes a call, how a reply is read back, and the instructions that teach it.

A format is chosen by name (``--rollout.tool_call_format``, :func:`call_format`):

* ``"hermes"`` (Hermes / Qwen, plain text any model can write; SmolLM2's chat template has no tool syntax)::

      <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>

  A reply may hold several calls anywhere in its text.
* ``"llama3_json"`` (Llama 3.1 / 3.2's JSON tool calling): the reply *is* the call, optionally after
  ``<|python_tag|>``::

      {"name": "add", "parameters": {"a": 2, "b": 3}}

  (``"arguments"`` is accepted for ``"parameters"``); several calls are separated by ``;`` or new lines. A reply that
  does not start with ``{`` (nor with the tag) calls nothing.

Reading a reply never raises: whatever the model wrote, a call that cannot be read is a ``malformed``
:class:`~lit_fgrpo.environments.tools.ToolCallError` the model reads back (with the format's :attr:`CallFormat.hint`).
That includes JSON that Python's parser refuses with something other than ``JSONDecodeError``: about 1,000 nested
``[`` raise ``RecursionError``, an integer of more than 4,300 digits ``ValueError`` (Python 3.11).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from lit_fgrpo.environments.tools import ParsedCall, ToolCall, ToolCallError, argument_error
from lit_fgrpo.errors import ConfigError

ToolCallFormat = Literal["hermes", "llama3_json"]
"""The tool-call formats by name (``--rollout.tool_call_format``)."""

TOOL_CALL_FORMATS: tuple[str, ...] = ("hermes", "llama3_json")

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


class CallFormat(Protocol):
    """One tool-call format: reads a reply's calls and says how to write one."""

    name: str
    """The format's name (:data:`ToolCallFormat`)."""
    hint: str
    """How a call is written, shown to the model after a malformed call."""

    def parse(self, text: str, schemas: Sequence[Mapping[str, Any]]) -> list[ParsedCall]:
        """Every call of a reply, in order, each checked against the tools' schemas; never raises."""
        ...

    def instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """A system-prompt paragraph listing the tools and this format, for templates without tool syntax."""
        ...

    def write(self, call: ToolCall) -> str:
        """``call`` written as the model should write it (what :meth:`parse` reads back)."""
        ...


def _why_not_json(err: Exception, offset: int = 0) -> str:
    """One line for the model: why its text did not parse (``offset``: where the text began in the reply)."""
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON ({err.msg} at character {err.pos - offset})"
    if isinstance(err, RecursionError):  # ~1,000 nested brackets: the parser's recursion limit
        return "not JSON (nested too deeply)"
    if isinstance(err, ValueError):  # Python 3.11 refuses to convert an integer of more than 4,300 digits
        return "not JSON (a number with too many digits)"
    return f"not JSON ({type(err).__name__})"


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)`` and ``None``, or ``None`` and why the text is not JSON; never raises."""
    try:
        return json.loads(text), None
    except Exception as err:  # model output never ends the run, whatever the parser raises
        return None, _why_not_json(err)


def _decode_at(text: str, start: int) -> tuple[Any, int, str | None]:
    """The JSON value that starts at ``text[start]``, where it ends, and ``None``; or why it cannot be read."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
        return value, end, None
    except Exception as err:  # as in _loads: never raises
        return None, start, _why_not_json(err, start)


def _checked_call(value: Any, tools: Mapping[str, Mapping[str, Any]], keys: tuple[str, ...], hint: str) -> ParsedCall:
    """A decoded call object as a :class:`ToolCall`, or the :class:`ToolCallError` saying what is wrong with it.

    Args:
        value: The decoded JSON.
        tools: The tools' ``function`` schemas by name.
        keys: The names the arguments may go under (the first present is read).
        hint: The format's :attr:`CallFormat.hint`, for a malformed call.
    """
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCallError("malformed", 'expected a JSON object with a "name" string', hint=hint)
    name = value["name"]
    key = next((k for k in keys if k in value), keys[0])
    arguments = value.get(key, {})
    if isinstance(arguments, str):  # the OpenAI wire format sends the arguments as a JSON string
        arguments, problem = _loads(arguments)
        if problem is not None:
            return ToolCallError("malformed", f'"{key}" is a string that is not JSON', name, hint=hint)
    if not isinstance(arguments, dict):
        return ToolCallError("malformed", f'"{key}" must be a JSON object', name, hint=hint)
    if name not in tools:
        return ToolCallError("unknown_tool", f"no tool named {name!r}", name)
    problem = argument_error(arguments, tools[name].get("parameters", {}))
    if problem is not None:
        return ToolCallError("bad_arguments", problem, name)
    return ToolCall(name, arguments)


def _by_name(schemas: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(s["function"]["name"]): s["function"] for s in schemas}


def _schema_lines(schemas: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(json.dumps(schema) for schema in schemas)


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, anywhere in the reply, as often as needed."""

    name = "hermes"
    hint = f'{TOOL_CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}'

    def parse(self, text: str, schemas: Sequence[Mapping[str, Any]]) -> list[ParsedCall]:
        """One :class:`ToolCall` or :class:`ToolCallError` per opening tag; an empty list when nothing is called."""
        tools = _by_name(schemas)
        parsed: list[ParsedCall] = []
        start = text.find(TOOL_CALL_OPEN)
        while start >= 0:
            body_start = start + len(TOOL_CALL_OPEN)
            end = text.find(TOOL_CALL_CLOSE, body_start)
            following = text.find(TOOL_CALL_OPEN, body_start)
            if end < 0 or 0 <= following < end:  # an unclosed call spoils only itself
                parsed.append(ToolCallError("malformed", f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}", hint=self.hint))
                start = following
                continue
            value, problem = _loads(text[body_start:end].strip())
            if problem is not None:
                parsed.append(ToolCallError("malformed", problem, hint=self.hint))
            else:
                parsed.append(_checked_call(value, tools, ("arguments",), self.hint))
            start = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
        return parsed

    def instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """The Hermes wording: the schemas as JSON lines inside ``<tools></tools>``, then how to write a call."""
        return (
            "You may call one or more functions to help with the user query. The functions are listed inside "
            f"<tools></tools>:\n<tools>\n{_schema_lines(schemas)}\n</tools>\n"
            "To call a function, write a JSON object with its name and arguments inside tags, like this:\n"
            f'{TOOL_CALL_OPEN}{{"name": <function-name>, "arguments": <args-json-object>}}{TOOL_CALL_CLOSE}\n'
            "Each call's result comes back in a tool message."
        )

    def write(self, call: ToolCall) -> str:
        return f"{TOOL_CALL_OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments})}{TOOL_CALL_CLOSE}"


class Llama3JsonFormat:
    """The reply is the call: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``; several
    calls separated by ``;`` or new lines."""

    name = "llama3_json"
    hint = '{"name": "<tool>", "parameters": {...}} as the whole reply'

    def parse(self, text: str, schemas: Sequence[Mapping[str, Any]]) -> list[ParsedCall]:
        """The reply's calls in order; an empty list when it does not start with ``{`` or the python tag."""
        body = text.strip()
        tagged = body.startswith(PYTHON_TAG)
        if tagged:
            body = body[len(PYTHON_TAG) :].lstrip()
        if not body.startswith("{"):
            return [ToolCallError("malformed", f"{PYTHON_TAG} without a JSON object", hint=self.hint)] if tagged else []
        tools = _by_name(schemas)
        parsed: list[ParsedCall] = []
        position = 0
        while position < len(body):
            if body[position] != "{":
                detail = "text after the calls (a reply that calls a tool holds only calls, separated by ';')"
                parsed.append(ToolCallError("malformed", detail, hint=self.hint))
                break
            value, end, problem = _decode_at(body, position)
            if problem is not None:  # the rest cannot be split into calls once one does not parse
                parsed.append(ToolCallError("malformed", problem, hint=self.hint))
                break
            parsed.append(_checked_call(value, tools, ("parameters", "arguments"), self.hint))
            position = end
            while position < len(body) and (body[position].isspace() or body[position] == ";"):
                position += 1
        return parsed

    def instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """The schemas as JSON lines, then the reply-is-the-call rule."""
        return (
            "You have access to the following functions, one JSON schema per line:\n"
            f"{_schema_lines(schemas)}\n"
            "To call a function, reply with only a JSON object in this format, and nothing else:\n"
            '{"name": <function-name>, "parameters": <args-json-object>}\n'
            "Several calls go on separate lines. Each call's result comes back in a tool message."
        )

    def write(self, call: ToolCall) -> str:
        return json.dumps({"name": call.name, "parameters": call.arguments})


_FORMATS: dict[str, CallFormat] = {"hermes": HermesFormat(), "llama3_json": Llama3JsonFormat()}


def call_format(name: str) -> CallFormat:
    """The tool-call format named ``name``.

    Raises:
        ConfigError: Naming ``--rollout.tool_call_format`` for an unknown name.
    """
    if name not in _FORMATS:
        raise ConfigError(f"--rollout.tool_call_format must be one of {', '.join(_FORMATS)}; got {name!r}")
    return _FORMATS[name]


def parse_tool_calls(
    text: str, schemas: Sequence[Mapping[str, Any]], format: ToolCallFormat = "hermes"
) -> list[ParsedCall]:
    """Every tool call of a reply in ``format`` (default Hermes), parsed and checked against the tools' schemas.

    Args:
        text: The model's reply (decoded for reading only; its tokens are kept as sampled).
        schemas: The tools' schemas (:func:`~lit_fgrpo.environments.tools.tool_schema`).
        format: The tool-call format.

    Returns:
        One :class:`ToolCall` or :class:`ToolCallError` per call; an empty list when the reply calls nothing.
    """
    return call_format(format).parse(text, schemas)


def tool_instructions(schemas: Sequence[Mapping[str, Any]], format: ToolCallFormat = "hermes") -> str:
    """A system-prompt paragraph listing the tools and how to call them in ``format`` (default Hermes), for chat
    templates without tool syntax of their own."""
    return call_format(format).instructions(schemas)
