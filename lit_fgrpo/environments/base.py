"""The environment interface, and the loader behind ``--rollout.environment`` and ``--rollout.tools``.

An environment is any class (or any zero-argument callable that makes one instance: TRL's ``environment_factory``);
no base class is needed. TRL's contract, which a class written for TRL meets unchanged:

* ``reset(**row) -> str | None`` starts an episode from its dataset row (the row's columns as they are, and
  ``prompt``). A string is appended to the prompt's last user message (TRL's rule); with environment-owned data (a
  row without a prompt) it *is* the prompt. ``None`` leaves the prompt as is.
* Every other public method is a *tool* the model may call (functions of the class whose names do not start with
  ``_``, other than ``reset`` and ``get_reward``, the only reserved names). Its schema comes from its type hints and
  Google-style docstring (:func:`lit_fgrpo.environments.tools.tool_schema`). Sync or async.
* ``get_reward() -> float`` (optional, sync or async) is the episode's reward, asked once when the episode ends.

One addition of ours: a *text* environment reads the model's replies. It subclasses :class:`TextEnvironment`, whose
``step(reply) -> (observation, done)`` then gets every reply without a tool call (a class that does not subclass it
may have a tool named ``step``, as a game's environment does). Without ``step`` a reply without tool calls ends the
episode (TRL's loop).

Configured as ``--rollout.environment my_pkg.envs:Calculator`` (or a built-in name, :data:`BUILTIN_ENVIRONMENTS`)
with ``--rollout.environment_args '{"max_value": 100}'`` for its constructor, or a mapping of names to classes routed
by the rows' ``environment`` column; ``--rollout.tools [my_pkg.tools:search]`` adds standalone functions as tools of
every episode (with or without an environment). :func:`load_environments` checks all of it before the first step and
names the setting in a one-line :class:`~lit_fgrpo.errors.ConfigError`.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lit_fgrpo.environments.tools import tool_schema
from lit_fgrpo.errors import ConfigError

ENVIRONMENT_FLAG = "--rollout.environment"
"""The setting that names the environment class, in error messages."""
ENVIRONMENT_ARGS_FLAG = "--rollout.environment_args"
"""The setting holding the class's constructor arguments, in error messages."""
TOOLS_FLAG = "--rollout.tools"
"""The setting listing standalone tool functions, in error messages."""
ROUTE_COLUMN = "environment"
"""The row column that picks the environment when ``--rollout.environment`` is a mapping (TRL's rule)."""

RESERVED_METHODS = ("reset", "get_reward")
"""Methods with a fixed meaning: never tools (TRL reserves these two only)."""

BUILTIN_ENVIRONMENTS = {
    "retry": "lit_fgrpo.environments.retry:RetryArithmetic",
    "calculator": "lit_fgrpo.environments.calculator:Calculator",
}
"""Built-in name -> the class it stands for."""


class Environment(Protocol):
    """What every environment has: ``reset(**row)``, returning text for the prompt or ``None``."""

    def reset(self, **row: Any) -> str | None: ...


class TextEnvironment:
    """Subclass this to make ``step(reply) -> (observation, done)`` read every reply without a tool call: the
    observation is the next user message (``None``: none), ``done`` ends the episode. Without this base class a method
    named ``step`` is a tool like any other (TRL's rule)."""

    def reset(self, **row: Any) -> str | None:
        """Start an episode (override it)."""
        return None

    def step(self, reply: str) -> tuple[str | None, bool]:
        """Read a reply (override it)."""
        raise NotImplementedError


def _is_text_environment(cls: type) -> bool:
    return issubclass(cls, TextEnvironment) and cls.step is not TextEnvironment.step


def tool_names(cls: type) -> list[str]:
    """The tools of an environment class: its public functions other than :data:`RESERVED_METHODS` (and ``step`` of a
    :class:`TextEnvironment`), sorted. Listed on the class (as TRL does): properties and attributes are not tools."""
    reserved = (*RESERVED_METHODS, "step") if _is_text_environment(cls) else RESERVED_METHODS
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in reserved and not name.startswith("_")
    ]


@dataclass(frozen=True)
class EnvironmentSpec:
    """A checked environment: how to make an instance, and what it offers."""

    cls: type
    """The instances' class."""
    make: Callable[[], Any]
    """A zero-argument callable that makes one instance (the class with its arguments, or the user's factory)."""
    tools: tuple[str, ...] = ()
    """The tool names (:func:`tool_names`)."""
    has_step: bool = False
    """Whether it is a :class:`TextEnvironment` (its ``step`` reads the replies)."""
    has_reward: bool = False
    """Whether the class defines ``get_reward`` (the environment owns a reward)."""

    @property
    def name(self) -> str:
        return self.cls.__name__

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, in :attr:`tools` order (``self`` is not a parameter)."""
        return [tool_schema(_as_bound(self.cls, name), self.name) for name in self.tools]


@dataclass(frozen=True)
class EnvironmentSet:
    """Every environment of a run, by name, and the standalone tools every episode has."""

    specs: Mapping[str, EnvironmentSpec] = field(default_factory=dict)
    """Name -> environment; one environment is named ``""``, a mapping routes rows by their ``environment`` column."""
    tools: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    """Standalone tools by name (``--rollout.tools``)."""

    @property
    def routed(self) -> bool:
        """Whether rows pick their environment (``--rollout.environment`` is a mapping)."""
        return "" not in self.specs and bool(self.specs)

    @property
    def has_reward(self) -> bool:
        """Whether some environment has a ``get_reward``."""
        return any(spec.has_reward for spec in self.specs.values())

    @property
    def names(self) -> str:
        """The environments' class names, for messages."""
        return ", ".join(spec.name for spec in self.specs.values()) or "tools only"

    def spec(self, name: str) -> EnvironmentSpec | None:
        return self.specs.get(name)

    def all_tools(self) -> list[str]:
        """Every tool name of every environment and the standalone ones, sorted."""
        return sorted({*self.tools, *(t for spec in self.specs.values() for t in spec.tools)})

    def tool_schemas(self, name: str) -> list[dict[str, Any]]:
        """The schemas an episode of environment ``name`` lists: its own tools, then the standalone ones."""
        spec = self.specs.get(name)
        own = spec.tool_schemas() if spec is not None else []
        return own + [tool_schema(fn, TOOLS_FLAG) for fn in self.tools.values()]


def _as_bound(cls: type, name: str) -> Any:
    """``cls.name`` as a method bound to a placeholder, so that its signature lacks ``self`` (no instance is made);
    a staticmethod as it is."""
    function = getattr(cls, name)
    if isinstance(inspect.getattr_static(cls, name), staticmethod):
        return function
    return types.MethodType(function, object())


def _import(path: str, flag: str, builtins: Mapping[str, str] | None = None) -> Any:
    target = (builtins or {}).get(path, path)
    module_name, sep, attr = target.partition(":") if ":" in target else target.rpartition(".")
    if not sep or not module_name or not attr:
        known = f" or one of {sorted(builtins)}" if builtins else ""
        raise ConfigError(f"{flag} {path!r}: expected 'package.module:name'{known}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever the module raises while it runs
        raise ConfigError(f"{flag} {path!r} does not import: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise ConfigError(f"{flag} {path!r} does not import: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def load_environment(target: str | Callable[[], Any], init_args: Mapping[str, Any] | None = None) -> EnvironmentSpec:
    """Import and check one environment.

    Args:
        target: A built-in name (:data:`BUILTIN_ENVIRONMENTS`), ``"package.module:Class"`` (or
            ``"package.module.Class"``), a class, or any zero-argument callable that returns an instance (TRL's
            ``environment_factory``; it is called once here to see the instances' class).
        init_args: The constructor's keyword arguments (``--rollout.environment_args``; a class only).

    Raises:
        ConfigError: One line naming the setting when it does not import, is not callable, makes an instance without
            ``reset``, has no tools and no ``step``, does not take ``init_args``, or a tool has no schema.
    """
    made = _import(target, ENVIRONMENT_FLAG, BUILTIN_ENVIRONMENTS) if isinstance(target, str) else target
    shown = target if isinstance(target, str) else getattr(made, "__name__", repr(made))
    args = dict(init_args or {})
    if isinstance(made, type):
        cls = made
        signature = inspect.signature(cls)
        try:
            signature.bind(**args)
        except TypeError as err:
            takes = ", ".join(signature.parameters) or "no arguments"
            raise ConfigError(
                f"{ENVIRONMENT_ARGS_FLAG} {args} do not fit {cls.__name__} (it takes {takes}): {err}"
            ) from None

        def make() -> Any:
            return cls(**args)

    elif callable(made):
        if args:
            raise ConfigError(
                f"{ENVIRONMENT_ARGS_FLAG} {args}: {shown!r} is a factory, not a class; it takes no arguments"
            )
        try:
            cls = type(made())
        except Exception as err:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG} {shown!r}: calling the factory raised {type(err).__name__}: {err}"
            ) from None
        make = made
    else:
        raise ConfigError(f"{ENVIRONMENT_FLAG} {shown!r} is a {type(made).__name__}, not a class or a factory")
    name = cls.__name__
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"{ENVIRONMENT_FLAG} {name} has no reset(**row) method")
    has_step = _is_text_environment(cls)
    tools = tuple(tool_names(cls))
    spec = EnvironmentSpec(cls, make, tools, has_step, callable(getattr(cls, "get_reward", None)))
    try:
        spec.tool_schemas()
    except ConfigError as err:
        raise ConfigError(f"{ENVIRONMENT_FLAG} {name}: {err}") from None
    return spec


def load_tools(targets: Sequence[str | Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Standalone tool functions (``--rollout.tools``) by name, each with a schema.

    Raises:
        ConfigError: Naming ``--rollout.tools`` when one does not import, is not callable, has no schema, or two
            share a name.
    """
    tools: dict[str, Callable[..., Any]] = {}
    for target in targets:
        fn = _import(target, TOOLS_FLAG) if isinstance(target, str) else target
        name = getattr(fn, "__name__", None)
        if not callable(fn) or not isinstance(name, str):
            raise ConfigError(f"{TOOLS_FLAG} {target!r} is not a function")
        if name in tools or name in RESERVED_METHODS:
            raise ConfigError(f"{TOOLS_FLAG}: two tools are named {name!r} (or it is a reserved name)")
        tool_schema(fn, TOOLS_FLAG)
        tools[name] = fn
    return tools


def load_environments(
    environment: str | Callable[[], Any] | Mapping[str, str | Callable[[], Any]] | None,
    init_args: Mapping[str, Any] | None = None,
    tools: Sequence[str | Callable[..., Any]] = (),
) -> EnvironmentSet:
    """Every environment of a run: one (named ``""``), or a mapping routed by the rows' ``environment`` column
    (``init_args`` then maps each name to its arguments), and the standalone tools.

    Raises:
        ConfigError: As :func:`load_environment` and :func:`load_tools`; also when neither is given, or a standalone
            tool shares an environment tool's name.
    """
    standalone = load_tools(tools)
    if environment is None:
        if not standalone:
            raise ConfigError(f"multi-turn episodes need {ENVIRONMENT_FLAG} or {TOOLS_FLAG}")
        specs: dict[str, EnvironmentSpec] = {}
    elif isinstance(environment, Mapping):
        if not environment:
            raise ConfigError(f"{ENVIRONMENT_FLAG} is an empty mapping")
        args = dict(init_args or {})
        unknown = sorted(set(args) - set(environment))
        if unknown:
            raise ConfigError(f"{ENVIRONMENT_ARGS_FLAG} names {unknown}, which are not in {ENVIRONMENT_FLAG}")
        specs = {str(name): load_environment(target, args.get(name)) for name, target in environment.items()}
    else:
        specs = {"": load_environment(environment, init_args)}
    for spec in specs.values():
        clash = sorted(set(spec.tools) & set(standalone))
        if clash:
            raise ConfigError(f"{TOOLS_FLAG} {clash} share a name with {spec.name}'s tools")
        if not spec.tools and not spec.has_step and not standalone:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG} {spec.name} has no tools (public methods), is not a TextEnvironment with "
                "step(reply), and no --rollout.tools are given: the model's replies would go nowhere"
            )
    return EnvironmentSet(specs, standalone)
