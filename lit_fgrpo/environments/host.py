"""What runs an episode's environment calls, wherever they run: :class:`Host` holds the instances and makes each call.

A worker (:mod:`lit_fgrpo.environments.workers`) owns one :class:`Host`: the instances of the environments it serves
(one per environment name, made on its first episode, reset between episodes, as TRL pools them) and the run's
standalone tools. It receives a request (a list of :class:`Call`), makes the calls in order and answers one
:data:`Outcome` per call:

* ``("ok", value)``: the call returned. A tool's value is already the text the model reads
  (:func:`~lit_fgrpo.environments.tools.render_value`); ``get_reward``'s a finite float; ``reset``'s and ``step``'s
  checked (:mod:`~lit_fgrpo.environments.faults`).
* ``("tool_error", text, kind)``: a tool raised. The model reads ``text`` (TRL shows ``{"error": ...}``): its mistake
  gets a signal, and the episode stays scorable. ``kind`` is ``"tool_error"`` for
  :class:`~lit_fgrpo.environments.tools.ToolError` (the tool rejecting its arguments on purpose), else
  ``"tool_exception"``.
* ``("fault", reason)``: the constructor, ``reset``, ``step`` or ``get_reward`` raised or returned something unusable,
  or a call ran past its time limit. The episode is unscorable, the instance is dropped (its state is unknown), and
  the rest of the request is not run.

Sync and async callables alike: an awaitable result is run to completion on the host's own event loop (one per
host, kept between calls, so an environment may keep loop-bound state).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_fgrpo.environments.faults import EnvironmentFault, checked_observation, checked_step
from lit_fgrpo.environments.tools import ToolError, render_value

CallKind = Literal["make", "reset", "step", "get_reward", "tool", "attribute", "method"]
"""What a call is: the constructor, a life-cycle method, a tool, or reading an attribute or calling a method for a
reward function's ``environments=`` view of an instance that lives in a worker process."""

Outcome = tuple[Any, ...]
"""``("ok", value)``, ``("tool_error", text, kind)`` or ``("fault", reason)``."""


class CallTimeout(BaseException):
    """Raised inside a call that ran past its time limit (a ``BaseException``: a tool's ``except Exception`` must
    not swallow the cut)."""


@dataclass(frozen=True)
class Call:
    """One call of a request."""

    kind: CallKind
    environment: str
    """The environment's name (the ``environment`` column's value with a dict of environments; ``""`` for one)."""
    name: str = ""
    """The tool's or attribute's name."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()
    standalone: bool = False
    """A tool given with ``--rollout.tools`` rather than a method of the environment."""

    @property
    def what(self) -> str:
        """The call's name in a fault's reason."""
        if self.kind == "make":
            return "the environment's constructor"
        return f"tool {self.name!r}" if self.kind == "tool" else self.name or self.kind


def finite_reward(value: Any) -> float:
    """``get_reward``'s value as a finite float: any real number, ``numpy`` scalars and bools included (``True`` is
    1.0, as ``float(True)``).

    Raises:
        EnvironmentFault: If it is not a real number, does not fit a float, or is NaN or infinite.
    """
    if not isinstance(value, numbers.Real):
        try:  # numpy scalars of other kinds, 0-d arrays, tensors: whatever float() accepts as one number
            value = float(value)
        except Exception:
            raise EnvironmentFault(f"get_reward returned {_short(value)}, expected a number") from None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        raise EnvironmentFault(f"get_reward returned {_short(value)}, which does not fit a float") from None
    if not math.isfinite(number):
        raise EnvironmentFault(f"get_reward returned {number}, expected a finite number")
    return number


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


class Host:
    """The instances and tools of one worker, and the calls made on them.

    Args:
        factories: Environment name -> zero-argument callable making an instance.
        tools: Standalone tool name -> function (``--rollout.tools``).
        check_picklable: Values must cross a pipe (a worker process): check them here, where a fault can name them.
    """

    def __init__(
        self,
        factories: Mapping[str, Callable[[], Any]],
        tools: Mapping[str, Callable[..., Any]],
        check_picklable: bool = False,
    ) -> None:
        self.factories = factories
        self.tools = tools
        self.check_picklable = check_picklable
        self.instances: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def instance(self, environment: str) -> Any:
        """The live instance of ``environment`` (``None`` before its first episode or after a fault)."""
        return self.instances.get(environment)

    def run(self, calls: list[Call], before: Callable[[], None], after: Callable[[], None]) -> list[Outcome]:
        """Make ``calls`` in order; one outcome each, stopping after the first fault.

        Args:
            calls: The request.
            before: Called before each call (a worker arms its timer there).
            after: Called after each call, however it ended (the timer disarmed).
        """
        outcomes: list[Outcome] = []
        for call in calls:
            try:
                before()
                try:
                    outcome = self._one(call)
                finally:
                    after()
            except CallTimeout:
                outcome = ("fault", "timed out")
            except EnvironmentFault as fault:
                outcome = ("fault", fault.reason)
            except BaseException as err:  # user code: SystemExit and KeyboardInterrupt from it are its episode's
                outcome = ("fault", f"{call.what} raised {type(err).__name__}: {_message(err)}")
            if outcome[0] == "fault":
                self.instances.pop(call.environment, None)
                outcome = ("fault", _reason(call, outcome[1]))
            outcomes.append(outcome)
            if outcome[0] == "fault":
                break
        return outcomes

    def _one(self, call: Call) -> Outcome:
        if call.kind == "make":
            self.instances[call.environment] = self._await(self.factories[call.environment]())
            return ("ok", None)
        if call.kind == "tool" and call.standalone:
            return self._tool(self.tools[call.name], call)
        instance = self.instances.get(call.environment)
        if instance is None:
            raise EnvironmentFault("the environment was dropped after an earlier fault")
        if call.kind == "tool":
            return self._tool(getattr(instance, call.name), call)
        if call.kind == "attribute":
            value = getattr(instance, call.name)
            if callable(value):
                return ("ok", ("callable", None))
            return ("ok", ("value", self._sendable(value, f"attribute {call.name!r}")))
        if call.kind == "method":
            value = self._await(getattr(instance, call.name)(*call.args, **call.kwargs))
            return ("ok", self._sendable(value, f"{call.name}()'s value"))
        method = getattr(instance, call.kind)
        value = self._await(method(*call.args, **call.kwargs))
        if call.kind == "reset":
            return ("ok", checked_observation(value, "reset"))
        if call.kind == "step":
            return ("ok", checked_step(value))
        return ("ok", finite_reward(value))

    def _tool(self, fn: Callable[..., Any], call: Call) -> Outcome:
        try:
            value = self._await(fn(*call.args, **call.kwargs))
        except ToolError as err:
            return ("tool_error", f"error: {call.name}: {_message(err)}", "tool_error")
        except Exception as err:  # the model's call made the tool fail: the model reads it (TRL's {"error": ...})
            return ("tool_error", f"error: {call.name} raised {type(err).__name__}: {_message(err)}", "tool_exception")
        return ("ok", render_value(value))

    def _await(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_wrapped(value))

    def _sendable(self, value: Any, what: str) -> Any:
        if self.check_picklable:
            try:
                pickle.dumps(value)
            except Exception as err:
                raise EnvironmentFault(
                    f"{what} is {type(value).__name__}, which cannot leave its worker: {err}"
                ) from None
        return value

    def close(self) -> None:
        """Drop the instances and the event loop."""
        self.instances.clear()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()


async def _wrapped(awaitable: Any) -> Any:
    return await awaitable


def _message(err: BaseException, limit: int = 300) -> str:
    try:
        text = str(err)
    except Exception:  # an exception whose __str__ raises
        text = "<unprintable>"
    return text if len(text) <= limit else f"{text[:limit]}..."


def _reason(call: Call, reason: str) -> str:
    """A fault's reason, naming the call when the reason does not already."""
    if reason == "timed out":
        return f"{call.what} timed out"
    return reason


__all__ = ["Call", "CallKind", "CallTimeout", "Host", "Outcome", "finite_reward"]
