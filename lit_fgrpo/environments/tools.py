"""Tools: their JSON schemas, the calls the model writes, checking them, and the tool message it reads back.

Schemas come from the method's type hints and its Google-style docstring (the summary line and the ``Args:``
section), through :func:`transformers.utils.get_json_schema`, as TRL builds them::

    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "number", "description": "..."}, ...},
                    "required": ["a", "b"]}}}

How a call is written and read (Hermes' ``<tool_call>{...}</tool_call>``, Llama 3's bare JSON) is the
:mod:`~lit_fgrpo.environments.call_formats` module's. A reply may hold several calls; each one is run in order and
answered by one tool message (none is dropped, unlike TRL #4708). A call that cannot be run is never an exception
(TRL #4881): it becomes a :class:`ToolCallError` of kind

* ``"malformed"``: text that cannot be read as a call in the run's format (not JSON, no ``name`` string, arguments
  that are not an object);
* ``"unknown_tool"``: a name that is not one of the environment's tools;
* ``"bad_arguments"``: a missing required argument, an unexpected one, or a value of the wrong JSON type;

whose :func:`error_message` the model reads as the tool message, and which is counted. A tool that raises is
answered with its error too (:mod:`lit_fgrpo.environments.host`: :class:`ToolError`, the tool rejecting its arguments
on purpose, is counted as ``"tool_error"``, any other exception as ``"tool_exception"``); only a call past its time
limit is an environment fault (:mod:`lit_fgrpo.environments.faults`): the episode becomes unscorable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_fgrpo.errors import ConfigError

CallErrorKind = Literal["malformed", "unknown_tool", "bad_arguments", "tool_error", "tool_exception"]
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
    """Raised by a tool to tell the model its call was wrong (``divide(1, 0)``): its message is the tool message,
    counted as ``"tool_error"``; the episode goes on. Any other exception is shown too, counted as
    ``"tool_exception"``."""


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
    hint: str | None = field(default=None, compare=False)
    """How a call is written in the run's format, shown after a malformed call's error (not part of equality)."""


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
            return f"argument {name!r} must be {spec.get('type')}, got {_shown(value)}"
    return None


def error_message(error: ToolCallError, schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tool message the model reads for a call that could not run: what was wrong and what to write instead."""
    names = ", ".join(_schemas_by_name(schemas))
    if error.kind == "malformed":
        return f"error: malformed tool call: {error.detail}." + (f" Write {error.hint}" if error.hint else "")
    if error.kind == "unknown_tool":
        return f"error: unknown tool {error.name!r}; the tools are: {names}"
    if error.kind == "bad_arguments":
        return f"error: bad arguments for {error.name!r}: {error.detail}"
    return f"error: {error.name}: {error.detail}"


MAX_RENDER_DEPTH = 64
"""Containers nested deeper than this are not written out: JSON and ``str()`` both recurse, and may hit the limit."""


def render_value(value: Any) -> str:
    """A tool's return value as the tool message's text: a string as it is, else JSON (``str()`` if not JSON-able).

    Never raises: a value nested deeper than :data:`MAX_RENDER_DEPTH`, or one that neither JSON nor ``str()`` can
    write (an integer of more than 4,300 digits, a ``__str__`` that raises), is shown as a one-line placeholder.
    """
    if isinstance(value, str):
        return value
    if _nested_deeper_than(value, MAX_RENDER_DEPTH):
        return f"<{type(value).__name__} nested deeper than {MAX_RENDER_DEPTH} levels>"
    for write in (json.dumps, str):
        try:
            return str(write(value))
        except Exception:  # not JSON-able, or past the int-to-text limit: try the next way
            continue
    return f"<{type(value).__name__} that cannot be shown as text>"


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists, tuples and dicts nest deeper than ``limit`` in ``value`` (iterative: deep values cannot
    overflow the stack here; a container met again, as in a cycle, is not walked twice)."""
    seen: set[int] = set()
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (list, tuple, dict)) or id(item) in seen:
            continue
        if depth >= limit:
            return True
        seen.add(id(item))
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def _shown(value: Any, limit: int = 80) -> str:
    """A value the model sent, as short JSON for an error message (never raises: deep or huge values are cut)."""
    text = json.dumps(value) if isinstance(value, str) else render_value(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
