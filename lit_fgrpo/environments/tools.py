"""Tools: their JSON schemas, the tool-call text the model writes, calling them, and the tool message it reads back.

Schemas come from the method's type hints and its Google-style docstring (the summary line and the ``Args:``
section), through :func:`transformers.utils.get_json_schema`, as TRL builds them::

    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "number", "description": "..."}, ...},
                    "required": ["a", "b"]}}}

The call format is the Hermes / Qwen convention, plain text any model can write (SmolLM2's chat template has no tool
syntax of its own)::

    <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>

A reply may hold several calls; each one is run in order and answered by one tool message (none is dropped, unlike
TRL #4708). A call that cannot be run is never an exception (TRL #4881): it becomes a :class:`ToolCallError` of kind

* ``"malformed"``: an unclosed ``<tool_call>``, text that is not a JSON object, no ``name`` string, ``arguments``
  that are not an object;
* ``"unknown_tool"``: a name that is not one of the environment's tools;
* ``"bad_arguments"``: a missing required argument, an unexpected one, or a value of the wrong JSON type;

whose :func:`error_message` the model reads as the tool message, and which is counted. A tool that rejects its
arguments itself raises :class:`ToolError` (shown to the model, counted as ``"tool_error"``); any other exception
or a timeout is an environment fault (:mod:`lit_fgrpo.environments.faults`): the episode becomes unscorable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lit_fgrpo.environments.faults import guarded_call
from lit_fgrpo.errors import ConfigError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

CallErrorKind = Literal["malformed", "unknown_tool", "bad_arguments", "tool_error"]
"""Why a tool call gave an error message instead of a result (``"tool_error"``: the tool raised :class:`ToolError`)."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class ToolError(Exception):
    """Raised by a tool to tell the model its call was wrong (``divide(1, 0)``): shown as the tool message, counted
    as ``"tool_error"``; the episode goes on. Any other exception from a tool makes the episode unscorable."""


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a known tool with arguments that fit its schema."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A call that cannot be run; :func:`error_message` is what the model reads back."""

    kind: CallErrorKind
    detail: str
    """What was wrong, one line."""
    name: str | None = None
    """The tool's name when the call named one."""


ParsedCall = ToolCall | ToolCallError


def tool_schema(fn: Callable[..., Any], owner: str) -> dict[str, Any]:
    """The JSON schema of ``fn`` (a bound method) from its type hints and Google-style docstring.

    Raises:
        ConfigError: Naming ``owner.fn`` when a parameter has no type hint or no ``Args:`` entry, or the docstring is
            missing.
    """
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", repr(fn))
    try:
        return dict(get_json_schema(fn))
    except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ConfigError(
            f"tool {owner}.{name} needs a type hint and a docstring 'Args:' entry for every parameter: {err}"
        ) from None


def _schemas_by_name(schemas: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(s["function"]["name"]): s["function"] for s in schemas}


def _type_fits(value: Any, spec: Mapping[str, Any]) -> bool:
    types = spec.get("type")
    if types is None:
        return True
    allowed = [types] if isinstance(types, str) else list(types)
    if spec.get("nullable") and value is None:
        return True
    for name in allowed:
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # JSON true is not a number, though Python's bool is an int
        if isinstance(value, _JSON_TYPES.get(name, object)):
            return "enum" not in spec or value in spec["enum"]
    return False


def argument_error(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit a tool's ``parameters`` schema (missing, unexpected, wrong type), or ``None``."""
    properties: Mapping[str, Any] = parameters.get("properties", {})
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument {', '.join(repr(n) for n in missing)}"
    unexpected = [name for name in arguments if name not in properties]
    if unexpected:
        return f"unexpected argument {', '.join(repr(n) for n in unexpected)} (arguments: {', '.join(properties)})"
    for name, value in arguments.items():
        spec = properties[name]
        if not _type_fits(value, spec):
            return f"argument {name!r} must be {spec.get('type')}, got {json.dumps(value)}"
    return None


def _parse_one(body: str, tools: Mapping[str, Mapping[str, Any]]) -> ParsedCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCallError("malformed", f"not JSON ({err.msg} at character {err.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCallError("malformed", 'expected a JSON object with a "name" string')
    name, arguments = call["name"], call.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI wire format sends the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCallError("malformed", '"arguments" is a string that is not JSON', name)
    if not isinstance(arguments, dict):
        return ToolCallError("malformed", '"arguments" must be a JSON object', name)
    if name not in tools:
        return ToolCallError("unknown_tool", f"no tool named {name!r}", name)
    problem = argument_error(arguments, tools[name].get("parameters", {}))
    if problem is not None:
        return ToolCallError("bad_arguments", problem, name)
    return ToolCall(name, arguments)


def parse_tool_calls(text: str, schemas: Sequence[Mapping[str, Any]]) -> list[ParsedCall]:
    """Every ``<tool_call>...</tool_call>`` of a reply, in order, parsed and checked against the tools' schemas.

    Args:
        text: The model's reply (decoded for reading only; its tokens are kept as sampled).
        schemas: The environment's tool schemas (:func:`tool_schema`).

    Returns:
        One :class:`ToolCall` or :class:`ToolCallError` per opening tag; an empty list when the reply calls nothing.
    """
    tools = _schemas_by_name(schemas)
    parsed: list[ParsedCall] = []
    start = text.find(TOOL_CALL_OPEN)
    while start >= 0:
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        following = text.find(TOOL_CALL_OPEN, body_start)
        if end < 0 or 0 <= following < end:
            parsed.append(ToolCallError("malformed", f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}"))
            start = following
            continue
        parsed.append(_parse_one(text[body_start:end].strip(), tools))
        start = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    return parsed


def error_message(error: ToolCallError, schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tool message the model reads for a call that could not run: what was wrong and what to write instead."""
    names = ", ".join(_schemas_by_name(schemas))
    if error.kind == "malformed":
        return (
            f"error: malformed tool call: {error.detail}. "
            f'Write {TOOL_CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}'
        )
    if error.kind == "unknown_tool":
        return f"error: unknown tool {error.name!r}; the tools are: {names}"
    if error.kind == "bad_arguments":
        return f"error: bad arguments for {error.name!r}: {error.detail}"
    return f"error: {error.name}: {error.detail}"


def render_value(value: Any) -> str:
    """A tool's return value as the tool message's text: a string as it is, else JSON (``str()`` if not JSON-able)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


_TOOL_ERROR = object()


def run_tool(fn: Callable[..., Any], call: ToolCall, timeout: float | None) -> tuple[str, ToolCallError | None]:
    """Call a tool under a time limit; its result (or its :class:`ToolError`) as the tool message's text.

    Returns:
        ``(text, None)`` for a result, ``(text, error)`` when the tool raised :class:`ToolError`.

    Raises:
        EnvironmentFault: If the tool raised anything else or timed out (the episode becomes unscorable).
    """

    def body() -> Any:
        try:
            return fn(**call.arguments)
        except ToolError as err:  # the model's mistake, shown to it: caught here, before the fault guard sees it
            return (_TOOL_ERROR, str(err))

    value = guarded_call(body, f"tool {call.name!r}", timeout)
    if isinstance(value, tuple) and len(value) == 2 and value[0] is _TOOL_ERROR:
        error = ToolCallError("tool_error", str(value[1]), call.name)
        return error_message(error, []), error
    return render_value(value), None


def tool_instructions(schemas: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt paragraph listing the tools and the call format, for chat templates without tool support.

    The Hermes wording: the schemas as JSON lines inside ``<tools></tools>``, then how to write a call.
    """
    lines = "\n".join(json.dumps(schema) for schema in schemas)
    return (
        "You may call one or more functions to help with the user query. The functions are listed inside "
        f"<tools></tools>:\n<tools>\n{lines}\n</tools>\n"
        "To call a function, write a JSON object with its name and arguments inside tags, like this:\n"
        f'{TOOL_CALL_OPEN}{{"name": <function-name>, "arguments": <args-json-object>}}{TOOL_CALL_CLOSE}\n'
        "Each call's result comes back in a tool message."
    )
