"""How many torch threads a generation gets: the cores that are free while it runs.

During a synchronous rollout or a held-out evaluation the trainer waits, so every core of the process is the
generation's, unless another process keeps one busy. That case matters on a small CPU box: torch's OpenMP threads
meet at a barrier after every operation, and a thread whose core is taken waits a scheduler slice each time, so
two threads on two cores of which one is busy elsewhere can decode slower than one thread. So :func:`free_cores` counts the cores that stayed mostly idle over a
short window (``/proc/stat``), and :func:`generation_threads` with ``"auto"`` uses that many, never fewer than one.

It is not the default. The default leaves torch's count as the caller set it (torch's own default is every core of
the machine, so a trainer that set nothing already generates on all of them): a count that follows the machine's
load would change float rounding from one call to the next (reductions split by thread), and with it a seeded run's
tokens, and it would undo the one-thread pin of the test suite.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch

from lit_fgrpo.errors import ConfigError

WINDOW_S = 0.05
"""How long :func:`free_cores` watches the cores (five of the kernel's 10 ms accounting ticks)."""


def allowed_cores() -> set[int]:
    """The CPU indices this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _cpu_times() -> dict[int, tuple[int, int]]:
    """``{cpu: (busy ticks, total ticks)}`` from ``/proc/stat`` (empty where there is none)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + ticks[4]
            out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def free_cores(window: float = WINDOW_S) -> int:
    """The allowed cores that were busy less than half of ``window`` seconds (at least 1; all allowed cores where
    ``/proc/stat`` cannot be read or did not advance)."""
    cores = allowed_cores()
    before = _cpu_times()
    if not before:
        return len(cores)
    time.sleep(window)
    after = _cpu_times()
    free = 0
    for cpu in cores:
        if cpu not in before or cpu not in after:
            free += 1
            continue
        busy, total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        free += total == 0 or busy * 2 < total
    return max(1, free)


Threads = int | Literal["auto"] | None
"""A generation's thread setting: a count, ``"auto"`` (:func:`free_cores`) or None (torch's current count)."""


def check_threads(threads: Threads, flag: str) -> None:
    """Refuse anything but None, ``"auto"`` or a whole number >= 1, naming ``flag``.

    Raises:
        ConfigError: one line naming the flag.
    """
    if threads is None or threads == "auto":
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"{flag} must be a whole number >= 1, auto or null, got {threads!r}")


@contextmanager
def generation_threads(threads: Threads) -> Iterator[int]:
    """torch's intra-op threads set to ``threads`` for the block, the caller's count restored after.

    ``None`` keeps the caller's count; ``"auto"`` takes :func:`free_cores`. Yields the count used.
    """
    before = torch.get_num_threads()
    count = before if threads is None else free_cores() if threads == "auto" else int(threads)
    if count != before:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


__all__ = ["Threads", "allowed_cores", "check_threads", "free_cores", "generation_threads"]
