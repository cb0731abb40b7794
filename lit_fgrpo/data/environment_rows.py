"""The ``environment`` source: data the environment owns, as TRL runs an ``environment_factory`` without a dataset.

The environment's ``reset()`` returns each episode's first user message, so a row holds no question:
``PromptRecord(prompt="", prompt_ids=[], messages=[], columns={})``. ``messages == []`` is the multi-turn driver's
sign that ``reset``'s return value is the conversation's first user message.

Training is endless: one template row, streamed by :class:`~lit_fgrpo.data.streaming.PromptStream` with a global
position per row (the source of its sampling seed, the same on any rank layout, resumable like any stream), so the
run's length is ``--trainer.max_steps`` (:func:`check_bounded_fit` refuses a fit that would never end). Validation
and test are ``environment_rows.val_size`` and ``test_size`` rows, positions ``0 .. n - 1`` (0 rows: no such split).
"""

from __future__ import annotations

from typing import Any

from lit_fgrpo.data.data_settings import ENVIRONMENT_SOURCE, EnvironmentRowSettings
from lit_fgrpo.data.records import PromptRecord
from lit_fgrpo.errors import ConfigError

MAX_STEPS = "--trainer.max_steps"
"""The flag that bounds a run of endless rows, named in the refusal."""


def environment_record(index: int) -> PromptRecord:
    """A row without a question: the environment's ``reset()`` gives the first user message."""
    return PromptRecord(prompt="", prompt_ids=[], columns={}, index=index, messages=[])


def environment_splits(settings: EnvironmentRowSettings) -> dict[str, list[PromptRecord]]:
    """The splits of the ``environment`` source: ``train`` is one row (the stream repeats it, each time at a new
    position), ``val`` and ``test`` hold their sizes' rows (left out when 0)."""
    splits = {"train": [environment_record(0)]}
    for split, size in (("val", settings.val_size), ("test", settings.test_size)):
        if size:
            splits[split] = [environment_record(index) for index in range(size)]
    return splits


def endless_fit(max_steps: int, max_epochs: int | None, limit_train_batches: Any, timed: bool) -> bool:
    """Whether a fit on an endless training stream would never stop.

    Args:
        max_steps: The trainer's ``max_steps`` (-1: none).
        max_epochs: Its ``max_epochs`` (``None``: Lightning's 1000 when ``max_steps`` is -1; -1: none).
        limit_train_batches: Its ``limit_train_batches``: an int ends each epoch, a fraction of an endless
            stream does not.
        timed: Whether a ``max_time`` (Lightning's ``Timer``) stops the run.
    """
    if max_steps >= 0 or timed:
        return False
    epochs_end = isinstance(limit_train_batches, int) and not isinstance(limit_train_batches, bool)
    return not (epochs_end and (max_epochs is None or max_epochs >= 0))


def check_bounded_fit(trainer: Any) -> None:
    """Refuse a Lightning fit over the endless ``environment`` rows that nothing would stop.

    Raises:
        ConfigError: Naming ``--trainer.max_steps``.
    """
    from lightning.pytorch.callbacks import Timer

    timed = any(isinstance(callback, Timer) for callback in getattr(trainer, "callbacks", []))
    max_steps = int(getattr(trainer, "max_steps", -1))
    if endless_fit(max_steps, trainer.max_epochs, trainer.limit_train_batches, timed):
        raise ConfigError(
            f"{MAX_STEPS} is required with --data.source {ENVIRONMENT_SOURCE}: the environment's rows never end, so "
            f"the run would never stop (got {max_steps})"
        )


__all__ = [
    "check_bounded_fit",
    "endless_fit",
    "environment_record",
    "environment_splits",
]
