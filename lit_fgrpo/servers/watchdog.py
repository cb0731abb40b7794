"""A launched server stops when its trainer dies, however it dies (``--exit-with <trainer pid>`` of the launcher).

:mod:`~lit_fgrpo.servers.reaper` stops the servers at exit, on Ctrl-C and on SIGTERM, but a trainer that is
SIGKILLed (the kernel's OOM killer, a scheduler's hard kill, a test timeout) runs none of its handlers, and its
servers would keep their cores and memory forever. So each server watches its parent itself: the launcher runs
:func:`exit_with` in a daemon thread of the API server, which is the leader of the server's process group. When the
parent is gone (the server was re-parented), the thread sends SIGTERM to the whole group (the API server shuts down
cleanly; the engine core and worker get it too), then SIGKILL to whatever is left after ``grace_s``.

Polling ``os.getppid()`` rather than Linux's ``PR_SET_PDEATHSIG``: the death signal fires when the *thread* that
started the child exits, and the trainer restarts dead servers from worker threads.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import suppress


def _signal_group(sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgrp(), sig)


def exit_with(parent_pid: int, poll_s: float = 1.0, grace_s: float = 15.0) -> threading.Thread:
    """Start a daemon thread that stops this process group once ``parent_pid`` is no longer this process's parent.

    Args:
        parent_pid: the trainer's pid (the process that started this one).
        poll_s: how often the parent is checked.
        grace_s: seconds between SIGTERM and SIGKILL of the group.

    Returns:
        The started thread.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        _signal_group(signal.SIGTERM)
        time.sleep(grace_s)
        _signal_group(signal.SIGKILL)

    thread = threading.Thread(target=watch, name="exit-with-trainer", daemon=True)
    thread.start()
    return thread
