"""Settings dataclasses from the plain mappings that store them (YAML given to Python, hparams, checkpoints).

The CLI's parser builds the settings dataclasses itself; everywhere else they arrive as data: a checkpoint's
``hyper_parameters`` (plain dicts, so that Lightning's ``weights_only`` load accepts them), a dict written in
Python. :func:`settings_from` turns either into the dataclass, and refuses a key that is not a field in one line
naming the full flag (``--model.objective.gama is not a setting; the settings are gamma, ...``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from lit_fgrpo.errors import ConfigError

T = TypeVar("T")


def settings_from(cls: type[T], value: T | Mapping[str, Any], flag: str) -> T:
    """``value`` as a ``cls`` instance: itself, or ``cls(**value)`` for a mapping of its fields.

    Args:
        cls: A dataclass whose ``__post_init__`` validates it.
        value: An instance, or a mapping of field names to values.
        flag: How the CLI names the settings (``--model.objective``), for the error message.

    Raises:
        ConfigError: For a value that is neither, or a key that is not a field of ``cls``.
    """
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{flag}: expected a mapping of {cls.__name__} fields, got {value!r}")
    known = [item.name for item in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for name in value:
        if name not in known:
            raise ConfigError(f"{flag}.{name} is not a setting; the settings are {', '.join(known)}")
    return cls(**value)
