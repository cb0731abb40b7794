"""Environment faults: a ``reset``, ``step``, tool or ``get_reward`` call that raises or runs past its time limit.

Such a call makes its episode **unscorable**: the episode ends, carries the reason
(:attr:`~lit_fgrpo.environments.episode.Episode.unscorable`), is counted (``environment_errors``) and is left out of
mu_hat and the loss. It is never scored 0: for F-GRPO a fault counted as a failure would lower the group's success
rate and so raise its weight (verl PR #6673 and verl-omni PR #366 are that silent failure).

A tool that means to tell the model "these arguments are wrong" raises
:class:`~lit_fgrpo.environments.tools.ToolError` instead: that is shown to the model as a tool message, not a fault.

Calls with a timeout run in a daemon thread (:func:`lit_fgrpo.rewards.guarded_call.call_with_timeout`): an environment
object keeps its state between calls, so it cannot run in a forked worker. A call that times out keeps running in its
abandoned thread; its episode and environment are dropped.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from lit_fgrpo.rewards.guarded_call import RewardTimeout, call_with_timeout


class EnvironmentFault(RuntimeError):
    """An environment call raised, timed out or returned something unusable; its episode is unscorable.

    Args:
        reason: One line: which call and what happened (``"step raised ValueError: boom"``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def guarded_call(fn: Callable[[], Any], what: str, timeout: float | None) -> Any:
    """``fn()``, any exception or a timeout turned into :class:`EnvironmentFault` naming ``what``.

    Args:
        fn: The call (a closure over the environment and its arguments).
        what: The call's name for the reason (``"reset"``, ``"step"``, ``"tool 'add'"``).
        timeout: Seconds the call may take; ``None`` runs it in the caller's thread without a limit.

    Raises:
        EnvironmentFault: If ``fn`` raised (``sys.exit`` included) or did not return within ``timeout``.
    """
    try:
        return call_with_timeout(fn, timeout, "thread")
    except RewardTimeout:
        raise EnvironmentFault(f"{what} timed out after {timeout:g} s") from None
    except Exception as err:  # the environment is user code: any error is its episode's, never the run's
        raise EnvironmentFault(f"{what} raised {type(err).__name__}: {err}") from None


def checked_observation(value: Any, what: str) -> str | None:
    """``value`` if it is a string or ``None`` (what ``reset`` and ``step`` may return as an observation).

    Raises:
        EnvironmentFault: Naming ``what`` and the type otherwise.
    """
    if value is None or isinstance(value, str):
        return value
    raise EnvironmentFault(f"{what} returned an observation of type {type(value).__name__}, expected str or None")


def checked_step(value: Any) -> tuple[str | None, bool]:
    """``step``'s ``(observation, done)``, checked.

    Raises:
        EnvironmentFault: If it is not a pair of ``str | None`` and ``bool``.
    """
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bool)):
        raise EnvironmentFault(f"step returned {value!r}, expected (observation: str | None, done: bool)")
    return checked_observation(value[0], "step"), value[1]


def checked_reward(value: Any) -> float:
    """``get_reward``'s value as a finite float.

    Raises:
        EnvironmentFault: If it is not a real number, or is NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EnvironmentFault(f"get_reward returned {value!r}, expected a number")
    if not math.isfinite(float(value)):
        raise EnvironmentFault(f"get_reward returned {value!r}, expected a finite number")
    return float(value)
