"""Settings dataclasses from the plain mappings that store them (YAML given to Python, hparams, checkpoints).

The CLI's parser builds the settings dataclasses itself; everywhere else they arrive as data: a checkpoint's
``hyper_parameters`` (plain dicts, so that Lightning's ``weights_only`` load accepts them), a dict written in
Python. :func:`settings_from` turns either into the dataclass, and refuses a key that is not a field in one line
naming the full flag (``--model.objective.gama is not a setting; the settings are gamma, ...``). The settings' own
``__post_init__`` checks use :func:`check_int`, :func:`check_choice` and :func:`check_text`, one line naming the flag.

Checkpoints written before the settings groups existed store them flat: :func:`group_flat_settings` rearranges them
and :func:`flat_checkpoint_init_args` reads them from a checkpoint, for the module and the data module alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar, get_args

from lit_fgrpo.errors import ConfigError

T = TypeVar("T")


def check_int(flag: str, value: Any, minimum: int) -> None:
    """Refuse a ``value`` that is not an int (a bool is not) or is below ``minimum``, naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag}: expected an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{flag} must be >= {minimum}, got {value}")


def check_choice(flag: str, value: Any, choices: Any) -> None:
    """Refuse a ``value`` that is not one of the ``Literal`` type ``choices``, naming ``flag``."""
    if value not in get_args(choices):
        raise ConfigError(f"{flag} must be one of {get_args(choices)}, got {value!r}")


def check_text(flag: str, value: Any, optional: bool = False) -> None:
    """Refuse a ``value`` that is not a non-empty string (or ``None`` when ``optional``), naming ``flag``."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{flag} must be a non-empty string, got {value!r}")


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


def read_checkpoint(checkpoint_path: str | Path | IO[bytes]) -> dict[str, Any]:
    """A checkpoint's entries, loaded with ``weights_only``; a file is memory-mapped (only what is read is read), a
    buffer is read and put back where it was."""
    import torch

    if isinstance(checkpoint_path, str | Path):
        return dict(torch.load(checkpoint_path, map_location="cpu", mmap=True, weights_only=True))
    position = checkpoint_path.tell()
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    checkpoint_path.seek(position)
    return dict(checkpoint)


def saved_hparams(checkpoint_path: str | Path | IO[bytes], key: str) -> dict[str, Any]:
    """The hyperparameters a checkpoint stores under ``key`` (``hyper_parameters`` for the module,
    ``datamodule_hyper_parameters`` for the data module); ``{}`` when it stores none."""
    return dict(read_checkpoint(checkpoint_path).get(key, {}))


def group_flat_settings(
    values: Mapping[str, Any],
    groups: Collection[str],
    flat_names: Mapping[str, tuple[str, str]],
    top_level: Collection[str],
    flag: str,
    owner: str,
) -> dict[str, Any]:
    """Settings given flat (an old checkpoint's hyperparameters) rearranged into their groups.

    A group given as a mapping (or as a settings dataclass) is kept, with the flat names of that group merged into
    it; a flat name goes to ``flat_names[name] = (group, field)``; ``top_level`` names stay where they are;
    LightningCLI's ``_instantiator`` and ``_class_path`` are dropped.

    Raises:
        ConfigError: ``<flag>.<name> is not a setting of <owner> (nor of an earlier version)``.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in groups:
            fields = (
                dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
            )
            out[key] = {**out.get(key, {}), **fields}
        elif key in flat_names:
            group, field = flat_names[key]
            out.setdefault(group, {})[field] = value
        elif key in top_level:
            out[key] = value
        elif key.startswith("_"):
            continue  # LightningCLI's _instantiator and _class_path: how it was built, not a setting
        else:
            raise ConfigError(f"{flag}.{key} is not a setting of {owner} (nor of an earlier version)")
    return out


def flat_checkpoint_init_args(
    checkpoint_path: str | Path | IO[bytes],
    key: str,
    flat_names: Collection[str],
    grouped: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """The grouped init arguments of a checkpoint whose settings under ``key`` are flat (``{}`` for grouped ones).

    Args:
        checkpoint_path: The checkpoint, a file (memory-mapped, so that only the hyperparameters are read) or a buffer.
        key: ``hyper_parameters`` (the module's) or ``datamodule_hyper_parameters``.
        flat_names: The old flat names; settings naming any of them are flat.
        grouped: Rearranges flat settings into the groups (the owner's :func:`group_flat_settings`).

    Returns:
        The grouped settings, with LightningCLI's ``_instantiator`` cleared (its parser would refuse the flat names).
    """
    saved = saved_hparams(checkpoint_path, key)
    if not any(name in flat_names for name in saved):
        return {}
    return grouped(saved) | {"_instantiator": None}
