"""Cases for test_schema_walk.py, generated from the CLI parser's own schema: every argument, a value of the wrong type.

A case is ``(name, argv, must_name)``: the command-line words after ``--config FILE`` and the strings the one
``error:`` line has to contain (the key; for a callback the class and the argument).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union

import yaml

REPO = Path(__file__).resolve().parents[2]
WRONG_TEXT = "not_a_value"
"""The wrong value: no number, no boolean, no list, no mapping and no choice of any Literal reads it."""


def _arguments(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return [hint]


def wrong_value(hint: Any) -> Any | None:
    """A value ``hint`` refuses, or ``None`` when every string is valid (``str``, ``Any``, paths, classes).

    Returns:
        ``"not_a_value"`` for numbers, booleans, lists, tuples, mappings and Literals; a dict of wrong values for a
        dataclass (its first field that has one).
    """
    members = _arguments(hint)
    if any(member in (str, Any) for member in members):
        return None  # every string is a valid value
    if len(members) == 1 and dataclasses.is_dataclass(members[0]):
        for field in dataclasses.fields(members[0]):
            inner = wrong_value(typing.get_type_hints(members[0])[field.name])
            if inner is not None:
                return {field.name: inner}
        return None
    for member in members:
        origin = typing.get_origin(member) or member
        if origin is Literal:
            continue
        if not (inspect.isclass(origin) and issubclass(origin, (int, float, bool, list, tuple, dict))):
            return None  # a class, a path, a callable: jsonargparse reads a string as a class path or a file name
    return WRONG_TEXT


def _leaf(value: Any, name: str) -> str:
    while isinstance(value, dict):
        name, value = next(iter(value.items()))
    return name


def argument_cases(parser: Any, groups: tuple[str, ...] = ("model.", "data.", "trainer.")) -> Iterator[tuple]:
    """One case per typed argument of ``parser`` under ``groups`` that has a wrong value (callbacks excluded)."""
    from jsonargparse._typehints import ActionTypeHint

    for action in parser._actions:
        if not isinstance(action, ActionTypeHint) or not action.dest.startswith(groups):
            continue
        if action.dest in ("trainer.callbacks", "trainer.plugins", "trainer.logger"):
            continue
        value = wrong_value(action._typehint)
        if value is None:
            continue
        text = json.dumps(value) if isinstance(value, dict) else value
        yield action.dest, [f"--{action.dest}", text], [f"--{action.dest}", _leaf(value, action.dest)]


def shipped_callbacks() -> list[str]:
    """The class paths of every callback in ``configs/**/*.yaml``."""
    found: set[str] = set()
    for path in REPO.glob("configs/**/*.yaml"):
        config = yaml.safe_load(path.read_text()) or {}
        for callback in (config.get("trainer") or {}).get("callbacks") or []:
            if isinstance(callback, dict) and "class_path" in callback:
                found.add(callback["class_path"])
    return sorted(found)


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def callback_cases() -> Iterator[tuple]:
    """One case per ``__init__`` argument with a wrong value of every shipped callback class."""
    for class_path in shipped_callbacks():
        cls = _import(class_path)
        hints = typing.get_type_hints(cls.__init__)
        for name in inspect.signature(cls.__init__).parameters:
            if name in ("self", "args", "kwargs") or name not in hints:
                continue
            value = wrong_value(hints[name])
            if value is None:
                continue
            callbacks = [{"class_path": class_path, "init_args": {name: value}}]
            short = class_path.rsplit(".", 1)[-1]
            yield f"{short}.{name}", ["--trainer.callbacks", json.dumps(callbacks)], [f"({short})", _leaf(value, name)]
