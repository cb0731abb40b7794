"""Workers that run environment calls: one per episode for all of its calls, cut at the time limit, pooled.

An episode is bound to one worker from its ``reset`` to its ``get_reward`` (state made in ``reset`` is there for its
tools), and the worker is reused for later episodes (its instances reset, not rebuilt, as TRL pools them). Requests
go to the worker without waiting (:meth:`Worker.submit`); :meth:`WorkerPool.wait` returns whichever answers come
first, so a slow environment holds up its own episode only.

``--rollout.environment_isolation``:

* ``"process"`` (default): a forked process per worker. A call past its time limit is cut inside the worker (a timer
  signal raises :class:`~lit_fgrpo.environments.host.CallTimeout` into Python code, ``time.sleep`` included); if the
  worker does not answer a second later (C code that holds on), it is killed. Either way nothing keeps running, and
  the episode is unscorable. The instances live in the worker: a reward function's ``environments=`` gets a
  :class:`RemoteEnvironment` that reads their attributes and calls their methods there. Forked, not spawned: the
  environment class may live anywhere (a test, a notebook) and need not be importable by name.
* ``"thread"``: a dedicated thread per worker in the trainer's process, the instances themselves handed to reward
  functions. A call past its time limit makes its episode unscorable but cannot be stopped: the thread is abandoned
  (and counted); use it for environments that cannot be forked.

:meth:`WorkerPool.close` ends every worker; a pool is also closed when it is garbage-collected and at exit.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

from lit_fgrpo.environments.host import Call, CallTimeout, Host, Outcome

Isolation = Literal["process", "thread"]
"""Where environment calls run: a forked worker ``process`` per worker (cut at the limit), or a ``thread``."""

KILL_GRACE_S = 1.0
"""Seconds past a request's limit before its worker process is killed (the timer signal had its chance)."""


class Worker:
    """One worker: a :class:`Host` behind a pipe, in a forked process or a thread of this one."""

    def __init__(self, make_host: Callable[[], Host], isolation: Isolation, timeout: float | None) -> None:
        self.make_host = make_host
        self.isolation = isolation
        self.timeout = timeout
        self.conn: Connection | None = None
        self.deadline: float | None = None
        """When the request in flight is over its limit (``None``: idle, or no limit)."""
        self.busy = False
        self.made: set[str] = set()
        """Environments whose instance this worker holds (as far as this side knows: a fault drops one)."""
        self.abandoned = 0
        """Threads left running past their limit (``thread`` isolation)."""
        self._process: Any = None
        self._thread: threading.Thread | None = None
        self._host: Host | None = None

    # ------------------------------------------------------------------ starting and stopping
    def _start(self) -> None:
        parent, child = multiprocessing.Pipe()
        if self.isolation == "process":
            context = multiprocessing.get_context("fork")
            gc.freeze()  # the child then leaves the parent's objects alone: its pages stay shared
            try:
                self._process = context.Process(
                    target=_serve_process, args=(child, self.make_host, self.timeout), daemon=True
                )
                self._process.start()
            finally:
                gc.unfreeze()
            child.close()
        else:
            self._host = self.make_host()
            self._thread = threading.Thread(
                target=_serve, args=(child, self._host, None), name="environment-worker", daemon=True
            )
            self._thread.start()
        self.conn = parent

    def stop(self) -> None:
        """End the worker (a process is killed if it does not leave at once); its instances are gone."""
        conn, process = self.conn, self._process
        self.conn, self._process, self._thread, self._host, self.busy, self.deadline = (
            None,
            None,
            None,
            None,
            False,
            None,
        )
        self.made.clear()
        if conn is not None:
            with contextlib.suppress(Exception):  # already gone
                conn.send(None)
            conn.close()
        if process is not None:
            process.join(0.5)
            if process.is_alive():
                process.kill()
                process.join(1.0)

    # ------------------------------------------------------------------ requests
    def submit(self, calls: Sequence[Call]) -> None:
        """Send a request; its answer comes through :meth:`WorkerPool.wait`."""
        if self.conn is None:
            self._start()
        assert self.conn is not None and not self.busy, "one request at a time per worker"
        self.conn.send(list(calls))
        self.busy = True
        if self.timeout is not None:
            grace = KILL_GRACE_S if self.isolation == "process" else 0.0
            self.deadline = time.monotonic() + len(calls) * self.timeout + grace

    def receive(self) -> list[Outcome]:
        """The answer to the request in flight (its pipe is readable); a dead worker's answer is one fault."""
        assert self.conn is not None
        try:
            outcomes: list[Outcome] = self.conn.recv()
        except (EOFError, OSError):
            code = self._process.exitcode if self._process is not None else None
            self.stop()
            return [("fault", f"the environment worker died (exit code {code})")]
        self.busy, self.deadline = False, None
        if outcomes and outcomes[-1][0] == "fault":
            self.made.clear()  # the host dropped the instance it faulted on; make it again next time
        return outcomes

    def cut(self) -> list[Outcome]:
        """The request in flight ran past its limit: stop the worker and answer with a fault."""
        if self.isolation == "thread":
            self.abandoned += 1
        self.stop()
        return [("fault", f"an environment call timed out (limit {self.timeout:g} s per call)")]

    def view(self, environment: str) -> Any:
        """What a reward function's ``environments=`` gets for this worker's instance of ``environment``."""
        if self.isolation == "thread":
            return None if self._host is None else self._host.instance(environment)
        return RemoteEnvironment(self, environment)


class RemoteEnvironment:
    """An environment instance that lives in a worker process, seen from the trainer: ``env.attr`` reads the
    attribute there (it must be picklable), ``env.method(...)`` calls it there (sync or async). Valid until the
    worker's next episode starts."""

    def __init__(self, worker: Worker, environment: str) -> None:
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_environment", environment)

    def _ask(self, call: Call) -> Any:
        worker: Worker = object.__getattribute__(self, "_worker")
        worker.submit([call])
        assert worker.conn is not None
        if not worker.conn.poll(None if worker.deadline is None else max(worker.deadline - time.monotonic(), 0)):
            worker.cut()
            raise TimeoutError(f"environment call {call.what} timed out")
        (outcome,) = worker.receive()
        if outcome[0] != "ok":
            raise RuntimeError(outcome[1])
        return outcome[1]

    def __getattr__(self, name: str) -> Any:
        environment = object.__getattribute__(self, "_environment")
        kind, value = self._ask(Call("attribute", environment, name))
        if kind == "value":
            return value

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._ask(Call("method", environment, name, kwargs, args))

        return method


def _serve(conn: Connection, host: Host, timeout: float | None) -> None:
    """A worker's loop: requests in, outcomes out, until ``None`` or the pipe closes."""
    arm, disarm = _timer(timeout)
    while True:
        try:
            calls = conn.recv()
        except (EOFError, OSError):
            break
        if calls is None:
            break
        outcomes = host.run(calls, arm, disarm)
        try:
            conn.send(outcomes)
        except (EOFError, OSError):  # the trainer stopped waiting (a cut thread): nobody to answer
            break
        except Exception as err:  # a value that cannot be pickled after all
            conn.send([("fault", f"an environment value could not be sent back: {type(err).__name__}: {err}")])
    host.close()


def _serve_process(conn: Connection, make_host: Callable[[], Host], timeout: float | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops the workers
    os.environ["OMP_NUM_THREADS"] = "1"
    _serve(conn, make_host(), timeout)


def _raise_timeout(signum: int, frame: Any) -> None:
    raise CallTimeout()


def _timer(timeout: float | None) -> tuple[Callable[[], None], Callable[[], None]]:
    """Arm/disarm a per-call timer signal in a worker process (a thread cannot be signalled: no timer there)."""
    if timeout is None or threading.current_thread() is not threading.main_thread():
        return (lambda: None), (lambda: None)
    signal.signal(signal.SIGALRM, _raise_timeout)

    def arm() -> None:
        signal.setitimer(signal.ITIMER_REAL, timeout)

    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    return arm, disarm


class WorkerPool:
    """Workers for a run's episodes, grown to the most episodes in flight and reused across steps.

    Args:
        factories: Environment name -> zero-argument callable making an instance.
        tools: Standalone tools by name.
        isolation: ``"process"`` or ``"thread"``.
        timeout: Seconds one call may take (``None``: no limit).
    """

    def __init__(
        self,
        factories: Mapping[str, Callable[[], Any]],
        tools: Mapping[str, Callable[..., Any]],
        isolation: Isolation = "process",
        timeout: float | None = 60.0,
    ) -> None:
        self.isolation = isolation
        self.timeout = timeout
        check = isolation == "process"
        self._make_host = lambda: Host(factories, tools, check_picklable=check)
        self.workers: list[Worker] = []
        self._finalizer = weakref.finalize(self, _stop_all, self.workers)

    def take(self, count: int) -> list[Worker]:
        """``count`` idle workers, started when first used (the pool grows; a worker is never shared by two live
        episodes)."""
        while len(self.workers) < count:
            self.workers.append(Worker(self._make_host, self.isolation, self.timeout))
        return self.workers[:count]

    def wait(self, workers: Sequence[Worker], timeout: float | None) -> list[tuple[Worker, list[Outcome]]]:
        """Answers of the busy ``workers`` that are in (at least one, unless ``timeout`` seconds pass first); a request
        past its limit is cut and answered with a fault."""
        busy = [w for w in workers if w.busy]
        if not busy:
            return []
        deadlines = [w.deadline for w in busy if w.deadline is not None]
        now = time.monotonic()
        limit = min(deadlines) - now if deadlines else None
        if timeout is not None:
            limit = timeout if limit is None else min(limit, timeout)
        ready = wait([w.conn for w in busy if w.conn is not None], None if limit is None else max(limit, 0.0))
        answers = [(w, w.receive()) for w in busy if w.conn in ready]
        now = time.monotonic()
        answers += [(w, w.cut()) for w in busy if w.busy and w.deadline is not None and w.deadline <= now]
        return answers

    @property
    def abandoned_threads(self) -> int:
        """Calls past their limit left running in abandoned threads (``thread`` isolation)."""
        return sum(w.abandoned for w in self.workers)

    def close(self) -> None:
        """End every worker: no process or thread is left behind."""
        _stop_all(self.workers)


def _stop_all(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


__all__ = ["KILL_GRACE_S", "Isolation", "RemoteEnvironment", "Worker", "WorkerPool"]
