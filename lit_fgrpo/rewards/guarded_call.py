"""Calling a reward function under a per-call timeout, in a thread or in a worker process.

A reward function that hangs (a regex blow-up, a sympy simplification that never ends) or crashes the process (a
segfault in a C extension, ``os._exit``) must not stall or end a training run. :func:`call_with_timeout` runs one call:

* ``isolation="thread"``: in a daemon thread joined with a timeout. Cheap; the function must be thread-safe. A call
  that times out keeps running in its abandoned daemon thread (Python cannot kill a thread) until it returns.
* ``isolation="process"``: in a forked worker process, killed on timeout. For functions that are not thread-safe
  (math-verify's ``signal.alarm`` timeout only works in a main thread) or that can crash the interpreter. Costs a
  fork per call; results travel back through a pipe, so they must be picklable (a list of floats is).

Either way a timeout raises :class:`RewardTimeout` and a crashed worker raises :class:`RewardCrash`; the scoring
code turns both into unscorable rows (``None``), counted and shown (one line naming the function and the rows).
``isolation="process"`` forks a worker with or without a timeout (without one it waits as long as the call takes):
a crash is contained either way. Under ``isolation="thread"`` a function that ends its process by ``sys.exit`` (a
``SystemExit``) raises :class:`RewardCrash` instead of ending the run; one that calls ``os._exit`` or sends itself
SIGKILL takes the trainer with it, as no thread can outlive its process: such functions need ``"process"``.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal

Isolation = Literal["thread", "process"]
"""Where a reward call with a timeout runs: a daemon thread or a forked worker process."""


class RewardTimeout(RuntimeError):
    """A reward call did not return within its timeout."""


class RewardCrash(RuntimeError):
    """A reward call's worker process died without returning (segfault, ``os._exit``, killed)."""


def _no_exit(fn: Callable[[], Any]) -> Any:
    """``fn()``, with a ``SystemExit`` it raises (``sys.exit`` in a reward) turned into :class:`RewardCrash`."""
    try:
        return fn()
    except SystemExit as err:
        raise RewardCrash(f"the function called sys.exit({err.code!r}) (the run goes on)") from None


def _in_thread(fn: Callable[[], Any], timeout: float) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=target, name="reward-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RewardTimeout(f"no result within {timeout:g} s (thread left running)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _child(fn: Callable[[], Any], conn: Any) -> None:
    try:
        conn.send(("ok", fn()))
    except BaseException as err:
        conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))
    finally:
        conn.close()


def _death(exitcode: int | None) -> str:
    """``"worker process died with exit code 7"``, or ``"... killed by SIGKILL"`` for a signal (a negative code)."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"worker process killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            pass
    return f"worker process died with exit code {exitcode}"


def _in_process(fn: Callable[[], Any], timeout: float | None) -> Any:
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context: Any = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    worker = context.Process(target=_child, args=(fn, send), daemon=True)
    worker.start()
    send.close()
    try:
        if not receive.poll(timeout):  # None: wait for a result or the worker's end (EOF), however long
            if worker.is_alive():
                raise RewardTimeout(f"no result within {timeout:g} s (worker process killed)")
            worker.join(1.0)
            raise RewardCrash(_death(worker.exitcode))
        try:
            status, value = receive.recv()
        except EOFError:
            worker.join(1.0)
            raise RewardCrash(_death(worker.exitcode)) from None
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join(5.0)
        receive.close()
    if status == "error":
        raise value
    return value


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, isolation: Isolation = "thread") -> Any:
    """Return ``fn()``, raising :class:`RewardTimeout` after ``timeout`` seconds (``None``: no limit).

    Without a timeout a ``"thread"`` call runs in the caller's thread, while a ``"process"`` call still runs in a
    worker process: isolation is asked for to survive a crash, with or without a time limit.

    Raises:
        RewardTimeout: If the call did not return in time.
        RewardCrash: If the worker process died (``isolation="process"``).
        ValueError: If ``timeout`` is not positive or ``isolation`` is unknown.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"reward timeout must be > 0 seconds, got {timeout}")
    if isolation == "thread":
        return _no_exit(fn) if timeout is None else _in_thread(lambda: _no_exit(fn), timeout)
    if isolation == "process":
        return _in_process(fn, timeout)
    raise ValueError(f"reward isolation must be 'thread' or 'process', got {isolation!r}")
