"""Stop every launched server when the trainer goes: at interpreter exit, on SIGINT and on SIGTERM.

A launched server is a process group (``start_new_session=True``): the API server, its engine core and the worker.
Killing only the API server orphans the other two (they keep their cores and memory), so the group is killed.
:func:`watch` registers a group; :func:`forget` drops it after a clean stop. The handlers are installed once, from
the main thread only (Python allows signal handlers nowhere else), and chain to the handlers they replaced, so
Ctrl-C still raises ``KeyboardInterrupt`` in the trainer after the servers are gone.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from contextlib import suppress
from types import FrameType
from typing import Any

_groups: set[int] = set()
_lock = threading.Lock()
_installed = False


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (nothing when it has gone)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_all() -> None:
    """Kill every watched group (atexit and the signal handlers call it)."""
    with _lock:
        groups = list(_groups)
        _groups.clear()
    for pgid in groups:
        kill_group(pgid)


def _chain(signum: int, previous: Any) -> Any:
    def handler(sig: int, frame: FrameType | None) -> None:
        kill_all()
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)

    return handler


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(kill_all)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _chain(signum, signal.getsignal(signum)))


def watch(pgid: int) -> None:
    """Kill group ``pgid`` at exit or on SIGINT / SIGTERM unless :func:`forget` is called first."""
    _install()
    with _lock:
        _groups.add(pgid)


def forget(pgid: int) -> None:
    """Stop watching ``pgid`` (it was stopped)."""
    with _lock:
        _groups.discard(pgid)
