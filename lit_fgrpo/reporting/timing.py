"""Per-phase wall-clock timers for a training step, cheap enough to stay on (logged under ``time/``).

Usage (one timer per step, or one kept across steps and summarised with ``reset=True`` each step)::

    timer = PhaseTimer()
    with timer.phase("generate"):
        generation = engine.generate(prompts, sampling)
    timer.add_tokens("generate", num_generated_tokens)
    ...
    values = timer.summary()  # {"time/generate": 0.23, "time/generate_tokens_per_s": 4410.0, ...}

A phase's time is the sum of its wall times over the calls since the last reset; phases may nest (an outer
``step`` around inner ones) but the inner ones are then counted inside the outer one too. On a GPU the work
is asynchronous: pass ``synchronize=True`` (a ``torch.cuda.synchronize()`` at each phase boundary, a few µs)
to charge kernels to the phase that launched them instead of the next one that waits on them. The overhead
of one ``phase`` call on a CPU is a few microseconds (:func:`phase_overhead_s` measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

# The phases of one RL step, in order; the keys the training loop logs (``time/<name>``). ``log``: the step's
# statistics (gathered over ranks) and Lightning's logging calls.
STEP_PHASES = (
    "generate", "reward", "old_logprobs", "ref_logprobs", "forward", "backward", "optimizer", "log", "sync", "wait",
)  # fmt: skip


class PhaseTimer:
    """Accumulates wall time per named phase and token counts for throughput.

    Args:
        prefix: key prefix in :meth:`summary`.
        synchronize: call ``torch.cuda.synchronize()`` when a phase starts and ends (only when CUDA is in use).
        clock: seconds as a float; ``time.perf_counter`` unless a test injects one.
    """

    def __init__(
        self, prefix: str = "time/", synchronize: bool = False, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.prefix = prefix
        self.synchronize = synchronize and torch.cuda.is_available()
        self.clock = clock
        self.seconds: dict[str, float] = {}
        """Accumulated wall time per phase since the last reset."""
        self.calls: dict[str, int] = {}
        """Number of completed ``phase`` blocks per phase since the last reset."""
        self.tokens: dict[str, tuple[float, tuple[str, ...]]] = {}
        """Token count per throughput key, with the phases whose time it is divided by."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block and add it to ``name`` (also when the block raises)."""
        if self.synchronize:
            torch.cuda.synchronize()
        start = self.clock()
        try:
            yield
        finally:
            if self.synchronize:
                torch.cuda.synchronize()
            self.add(name, self.clock() - start)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` measured elsewhere to phase ``name`` (e.g. a wait measured by another thread)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def add_tokens(self, key: str, tokens: float, phases: Iterable[str] | None = None) -> None:
        """Count ``tokens`` toward ``<prefix><key>_tokens_per_s`` = tokens / total time of ``phases``.

        Args:
            key: throughput name, e.g. "generate" or "train".
            tokens: tokens processed (generated completion tokens, or trained completion tokens).
            phases: the phases whose time the tokens took; default ``(key,)``.
        """
        over = tuple(phases) if phases is not None else (key,)
        count, _ = self.tokens.get(key, (0.0, over))
        self.tokens[key] = (count + float(tokens), over)

    def tokens_per_s(self, key: str) -> float:
        """Tokens counted for ``key`` divided by the time of its phases (0 when none was timed)."""
        count, over = self.tokens.get(key, (0.0, (key,)))
        seconds = sum(self.seconds.get(name, 0.0) for name in over)
        return count / seconds if seconds > 0 else 0.0

    def total(self, phases: Iterable[str] | None = None) -> float:
        """Sum of the given phases' times (default all; nested phases would be counted twice)."""
        names = self.seconds if phases is None else phases
        return sum(self.seconds.get(name, 0.0) for name in names)

    def summary(self, reset: bool = True) -> dict[str, float]:
        """``{"time/<phase>": seconds, ..., "time/<key>_tokens_per_s": rate}``; then clears the timer if ``reset``."""
        values = {f"{self.prefix}{name}": seconds for name, seconds in self.seconds.items()}
        for key in self.tokens:
            values[f"{self.prefix}{key}_tokens_per_s"] = self.tokens_per_s(key)
        if reset:
            self.reset()
        return values

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.tokens.clear()


def phase_overhead_s(calls: int = 10_000) -> float:
    """Wall time of one empty ``with timer.phase(...)`` block, in seconds (median of 5 batches of ``calls``)."""
    timer = PhaseTimer()
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            with timer.phase("x"):
                pass
        batches.append((time.perf_counter() - start) / calls)
    return sorted(batches)[2]
