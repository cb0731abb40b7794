"""Progress of the long phases outside Lightning's loops (warm start, pass@k evaluation, maze sweep).

On a terminal it draws a tqdm bar, the same kind Lightning's ``TQDMProgressBar`` draws for the RL steps. When the
stream is not a terminal (CI logs, ``nohup``, a pipe) a bar would write hundreds of carriage-return frames, so it
prints one status line instead each time another 10 % is done or ``every_s`` seconds have passed, e.g.::

    warm start: step 120/600 (20%), loss 1.23, 00:41 elapsed, ~02:44 left

Use::

    with progress("pass@k before RL", total=len(loader), unit="batch") as bar:
        for batch in loader:
            ...
            bar.update(1, reward=0.41)

Only rank 0 reports. ``LIT_FGRPO_PROGRESS`` = ``auto`` (default), ``bar``, ``lines`` or ``off`` overrides the mode.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TextIO

from lightning.fabric.utilities.rank_zero import rank_zero_only

Mode = Literal["auto", "bar", "lines", "off"]
MODES: tuple[str, ...] = ("auto", "bar", "lines", "off")


def format_duration(seconds: float) -> str:
    """``mm:ss`` below an hour, ``h:mm:ss`` above."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def format_metric(value: float) -> str:
    """Three significant digits, plain notation where that reads well."""
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def format_status(
    description: str, done: int, total: int | None, elapsed_s: float, metrics: dict[str, float], unit: str = "step"
) -> str:
    """One status line: ``<description>: <unit> done/total (pct%), <metrics>, <elapsed> elapsed, ~<eta> left``.

    The remaining time is the linear extrapolation ``elapsed * (total - done) / done``.
    """
    parts = [f"{unit} {done}/{total} ({100 * done // total}%)" if total else f"{unit} {done}"]
    parts += [f"{name} {format_metric(value)}" for name, value in metrics.items()]
    parts.append(f"{format_duration(elapsed_s)} elapsed")
    if total and 0 < done < total:
        parts.append(f"~{format_duration(elapsed_s * (total - done) / done)} left")
    return f"{description}: " + ", ".join(parts)


def resolve_mode(mode: Mode, stream: TextIO) -> Literal["bar", "lines", "off"]:
    """``auto`` becomes ``bar`` on a terminal and ``lines`` elsewhere; ``LIT_FGRPO_PROGRESS`` overrides ``auto``."""
    if mode == "auto":
        env = os.environ.get("LIT_FGRPO_PROGRESS", "auto").strip().lower()
        if env not in MODES:
            raise ValueError(f"LIT_FGRPO_PROGRESS must be one of {MODES}, got {env!r}")
        mode = env  # type: ignore[assignment]
    if mode == "auto":
        isatty = getattr(stream, "isatty", None)
        return "bar" if callable(isatty) and isatty() else "lines"
    return mode  # type: ignore[return-value]


class ProgressReporter:
    """A bar on a terminal, periodic status lines elsewhere (see the module docstring).

    Args:
        description: what runs, e.g. ``"warm start"``.
        total: number of units (None = unknown; no percentage or time left then).
        unit: the counted unit, e.g. ``"step"``, ``"batch"``, ``"arm"``.
        mode: ``auto``, ``bar``, ``lines`` or ``off``.
        every_s: in line mode, print at least this often (seconds) while updates come.
        every_fraction: in line mode, print each time another such fraction of ``total`` is done.
        stream: where to write (default ``sys.stdout``, where Lightning's progress bar writes too).
        enabled: report at all (default: on global rank 0 only).
    """

    def __init__(
        self,
        description: str,
        total: int | None,
        unit: str = "step",
        mode: Mode = "auto",
        every_s: float = 30.0,
        every_fraction: float = 0.1,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.description, self.total, self.unit = description, total, unit
        self.every_s, self.every_fraction = every_s, every_fraction
        self.stream = stream if stream is not None else sys.stdout
        on = (getattr(rank_zero_only, "rank", 0) == 0) if enabled is None else enabled
        self.mode = resolve_mode(mode, self.stream) if on else "off"
        self.done = self._printed_done = 0
        self.metrics: dict[str, float] = {}
        self.start = self._last_print = time.monotonic()
        self._tick = 1  # the next status line is due at tick * every_fraction of total
        self._bar: Any = None
        if self.mode == "bar":
            from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

            self._bar = Tqdm(desc=description, total=total, unit=unit, file=self.stream, dynamic_ncols=True)

    def update(self, n: int = 1, **metrics: float) -> None:
        """Advance by ``n`` units and show the latest ``metrics`` (name -> value)."""
        self.done += n
        self.metrics.update({name: float(value) for name, value in metrics.items()})
        if self.mode == "bar":
            self._bar.update(n)
            if metrics:
                self._bar.set_postfix({name: format_metric(v) for name, v in self.metrics.items()}, refresh=False)
        elif self.mode == "lines" and self._due():
            self._print_line()

    def _threshold(self) -> int:
        # integer thresholds: 0.1 * 3 * 20 is 6.000000000000001 in floats, and step 6 must count as 30 %
        return math.ceil(round(self._tick * self.every_fraction * (self.total or 0), 9))

    def _due(self) -> bool:
        now = time.monotonic()
        if self.total and self.done >= self.total:
            return True
        if self.total and self.done >= self._threshold():
            while self.done >= self._threshold():
                self._tick += 1
            return True
        return now - self._last_print >= self.every_s

    def _print_line(self) -> None:
        self._last_print, self._printed_done = time.monotonic(), self.done
        line = format_status(
            self.description, self.done, self.total, self._last_print - self.start, self.metrics, self.unit
        )
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Finish the bar (or print the last line when the run stopped between two status lines)."""
        if self.mode == "bar" and self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "lines" and self.done != self._printed_done:
            self._print_line()
        self.mode = "off"

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def progress(description: str, total: int | None, unit: str = "step", **kwargs: Any) -> Iterator[ProgressReporter]:
    """Context manager around :class:`ProgressReporter`; closes the bar even when the loop raises."""
    reporter = ProgressReporter(description, total, unit=unit, **kwargs)
    try:
        yield reporter
    finally:
        reporter.close()
