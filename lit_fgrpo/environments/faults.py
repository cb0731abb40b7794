"""Environment faults: an environment's own call (its constructor, ``reset``, ``step``, ``get_reward``) that raises,
runs past its time limit or returns something unusable, and a chat template that fails at run time.

Such a fault makes its episode **unscorable**: the episode ends, carries the reason
(:attr:`~lit_fgrpo.environments.episode.Episode.unscorable`) and its kind (``fault_kind``), is counted
(``environment_errors`` and ``environment_errors/<kind>``) and is left out of mu_hat and the loss. It is never scored
0: for F-GRPO a fault counted as a failure would lower the group's success rate and so raise its weight (verl PR
#6673 and verl-omni PR #366 are that silent failure).

A *tool* that raises is not a fault: the model called it, so the model reads the error (TRL's ``{"error": ...}``),
and the call is counted per tool (:mod:`~lit_fgrpo.environments.host`). Only a tool call past its time limit is a
fault: its worker is cut, and the state the episode's tools shared is gone.
"""

from __future__ import annotations

from typing import Any


class EnvironmentFault(RuntimeError):
    """An environment call raised, timed out or returned something unusable; its episode is unscorable.

    Args:
        reason: One line: which call and what happened (``"step raised ValueError: boom"``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def checked_observation(value: Any, what: str) -> str | None:
    """``value`` if it is a string or ``None`` (what ``reset`` and ``step`` may return as an observation).

    Raises:
        EnvironmentFault: Naming ``what`` and the type otherwise.
    """
    if value is None or isinstance(value, str):
        return value
    raise EnvironmentFault(f"{what} returned an observation of type {type(value).__name__}, expected str or None")


def checked_step(value: Any) -> tuple[str | None, bool]:
    """``step``'s ``(observation, done)``, checked (``done`` a bool, numpy's included).

    Raises:
        EnvironmentFault: If it is not a pair of ``str | None`` and a bool.
    """
    if not (isinstance(value, tuple) and len(value) == 2 and type(value[1]).__name__ in ("bool", "bool_")):
        shown = repr(value) if len(repr(value)) < 80 else f"a {type(value).__name__}"
        raise EnvironmentFault(f"step returned {shown}, expected (observation: str | None, done: bool)")
    return checked_observation(value[0], "step"), bool(value[1])
