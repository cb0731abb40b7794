"""The environment interface, and the loader behind ``--rollout.environment``.

An environment is any class; no base class is needed. One instance serves one episode:

* ``reset(**row) -> str | None`` starts the episode from its dataset row (the row's columns, e.g. ``answer``, plus
  ``prompt``). A string is appended to the prompt's last user message (TRL's rule); ``None`` leaves the prompt as is.
* ``step(reply) -> (observation, done)`` (a *text* environment) reads the model's reply; the observation is the next
  user message (``None``: none), ``done`` ends the episode.
* Every other public method is a *tool* the model may call (TRL's rule: functions defined on the class whose names do
  not start with ``_``, other than ``reset``, ``step`` and ``get_reward``). Its schema comes from its type hints and
  Google-style docstring (:func:`lit_fgrpo.environments.tools.tool_schema`).
* ``get_reward() -> float`` (optional) is the episode's reward, asked once when the episode ends.

A reply with tool calls runs the tools; a reply without goes to ``step``, or, for an environment without ``step``,
ends the episode (TRL's ``environment_factory`` loop). So a class written for TRL's ``environment_factory`` (``reset``,
tool methods, ``get_reward``) runs unchanged.

Configured as ``--rollout.environment my_pkg.envs:Calculator`` (or a built-in name, :data:`BUILTIN_ENVIRONMENTS`)
with ``--rollout.environment_args '{"max_value": 100}'`` for its constructor. :func:`load_environment` checks all of it
before the first step and names the setting in a one-line :class:`~lit_fgrpo.errors.ConfigError`.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lit_fgrpo.environments.tools import tool_schema
from lit_fgrpo.errors import ConfigError

ENVIRONMENT_FLAG = "--rollout.environment"
"""The setting that names the environment class, in error messages."""
ENVIRONMENT_ARGS_FLAG = "--rollout.environment_args"
"""The setting holding the class's constructor arguments, in error messages."""

RESERVED_METHODS = ("reset", "step", "get_reward")
"""Methods with a fixed meaning: never tools."""

BUILTIN_ENVIRONMENTS = {
    "retry": "lit_fgrpo.environments.retry:RetryArithmetic",
    "calculator": "lit_fgrpo.environments.calculator:Calculator",
}
"""Built-in name -> the class it stands for."""


class Environment(Protocol):
    """What every environment has: ``reset(**row)``, returning text to append to the prompt or ``None``."""

    def reset(self, **row: Any) -> str | None: ...


class TextEnvironment(Environment, Protocol):
    """An environment that reads the model's replies: ``step(reply) -> (observation, done)``."""

    def step(self, reply: str) -> tuple[str | None, bool]: ...


def tool_names(cls: type) -> list[str]:
    """The tools of an environment class: its public functions other than :data:`RESERVED_METHODS`, sorted.

    Listed on the class (as TRL does): properties, class attributes and instance attributes are not tools.
    """
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED_METHODS and not name.startswith("_")
    ]


@dataclass(frozen=True)
class EnvironmentFactory:
    """A checked environment class with its constructor arguments; calling it makes one episode's instance."""

    cls: type
    """The environment class."""
    init_args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of every instance's constructor."""
    tools: tuple[str, ...] = ()
    """The tool names (:func:`tool_names`)."""
    has_step: bool = False
    """Whether the class defines ``step`` (a text environment)."""
    has_reward: bool = False
    """Whether the class defines ``get_reward`` (the environment owns the reward)."""

    @property
    def name(self) -> str:
        return self.cls.__name__

    def __call__(self) -> Any:
        """A fresh instance for one episode."""
        return self.cls(**self.init_args)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, in :attr:`tools` order (``self`` is not a parameter)."""
        return [tool_schema(_as_bound(self.cls, name), self.name) for name in self.tools]


def _as_bound(cls: type, name: str) -> Any:
    """``cls.name`` as a method bound to a placeholder, so that its signature lacks ``self`` (no instance is made);
    a staticmethod as it is."""
    function = getattr(cls, name)
    if isinstance(inspect.getattr_static(cls, name), staticmethod):
        return function
    return types.MethodType(function, object())


def _import(path: str) -> Any:
    target = BUILTIN_ENVIRONMENTS.get(path, path)
    module_name, sep, attr = target.partition(":") if ":" in target else target.rpartition(".")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{ENVIRONMENT_FLAG} {path!r}: expected 'package.module:Class' or one of {sorted(BUILTIN_ENVIRONMENTS)}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever the module raises while it runs
        raise ConfigError(f"{ENVIRONMENT_FLAG} {path!r} does not import: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise ConfigError(f"{ENVIRONMENT_FLAG} {path!r} does not import: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def load_environment(target: str | type, init_args: Mapping[str, Any] | None = None) -> EnvironmentFactory:
    """Import and check an environment class; the factory that makes one instance per episode.

    Args:
        target: A built-in name (:data:`BUILTIN_ENVIRONMENTS`), ``"package.module:Class"`` (or
            ``"package.module.Class"``), or the class itself.
        init_args: The constructor's keyword arguments (``--rollout.environment_args``).

    Raises:
        ConfigError: One line naming the setting and the class when it does not import, is not a class, has no
            ``reset``, has no tools and no ``step``, does not take ``init_args``, or a tool has no schema (a parameter
            without a type hint or ``Args:`` entry).
    """
    cls = _import(target) if isinstance(target, str) else target
    shown = target if isinstance(target, str) else getattr(cls, "__name__", repr(cls))
    if not isinstance(cls, type):
        raise ConfigError(f"{ENVIRONMENT_FLAG} {shown!r} is a {type(cls).__name__}, not a class")
    name = cls.__name__
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"{ENVIRONMENT_FLAG} {name} has no reset(**row) method")
    has_step = callable(getattr(cls, "step", None))
    tools = tuple(tool_names(cls))
    if not tools and not has_step:
        raise ConfigError(
            f"{ENVIRONMENT_FLAG} {name} has no tools (public methods) and no step(reply) method: the model's replies "
            "would go nowhere"
        )
    args = dict(init_args or {})
    signature = inspect.signature(cls)
    try:
        signature.bind(**args)
    except TypeError as err:
        takes = ", ".join(signature.parameters) or "no arguments"
        raise ConfigError(f"{ENVIRONMENT_ARGS_FLAG} {args} do not fit {name} (it takes {takes}): {err}") from None
    factory = EnvironmentFactory(cls, args, tools, has_step, callable(getattr(cls, "get_reward", None)))
    try:
        factory.tool_schemas()
    except ConfigError as err:
        raise ConfigError(f"{ENVIRONMENT_FLAG} {name}: {err}") from None
    return factory
