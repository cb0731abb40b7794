"""The library's exception family for user mistakes.

Anything a user can fix without touching the library (a flag value, a data file, a checkpoint, a config file)
raises a :class:`UserError`. The ``lit-fgrpo`` command prints such an error as one ``error: ...`` line (plus at most
a short hint) and exits with status 2; every other exception is a bug and keeps its traceback.

``UserError`` subclasses :class:`ValueError`, so code and tests that catch ``ValueError`` keep working.

The message names the culprit first: the flag (``--model.objective.gamma must be >= 0, got -1.0``), the file and 1-based line
(``data/train.jsonl:3: malformed JSON ...``) or the argument (``group_advantages: gamma must be finite, got nan``).
"""

from __future__ import annotations

import math


class UserError(ValueError):
    """A mistake in the user's input, fixable without changing the library.

    Args:
        message: One line that names the flag, field, or file and line.
        hint: Optional short advice printed on a second line by the CLI.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(UserError):
    """A configuration value or config file is invalid (bad flag value, YAML syntax, missing interpolation key)."""


class DataError(UserError):
    """A data file or dataset is unreadable or has a bad row (names the file and line or row)."""


class CheckpointError(UserError):
    """A checkpoint is unreadable or does not match the run's configuration (names the path)."""


class ServiceError(UserError):
    """A service the run depends on failed beyond recovery, e.g. every generation server is gone (names the server,
    what was being done and its log file). Not a bug in the library: reported as one line, exit status 2."""


class NonFiniteError(UserError):
    """Training stopped after too many consecutive non-finite losses or gradients (names the step and quantity)."""


def check_finite(name: str, value: float) -> float:
    """Return ``value`` as a float, or raise :class:`ConfigError` naming ``name`` if it is NaN or infinite."""
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be finite, got {number}")
    return number


__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "NonFiniteError",
    "ServiceError",
    "UserError",
    "check_finite",
]
