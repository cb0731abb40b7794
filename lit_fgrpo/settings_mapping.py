"""Settings dataclasses from the plain mappings that store them (YAML given to Python, hparams, checkpoints).

The CLI's parser builds the settings dataclasses itself; everywhere else they arrive as data: a checkpoint's
``hyper_parameters`` (plain dicts, so that Lightning's ``weights_only`` load accepts them), a dict written in
Python. :func:`settings_from` turns either into the dataclass, and refuses a key that is not a field in one line
naming the full flag (``--model.objective.gama is not a setting; the settings are gamma, ...``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

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


def saved_hparams(checkpoint_path: str | Path | IO[bytes], key: str) -> dict[str, Any]:
    """The hyperparameters a checkpoint stores under ``key`` (``hyper_parameters`` for the module,
    ``datamodule_hyper_parameters`` for the data module); ``{}`` when it stores none.

    A file is memory-mapped, so that only the hyperparameters are read; a buffer is read and put back where it was.
    """
    import torch

    if isinstance(checkpoint_path, str | Path):
        checkpoint = torch.load(checkpoint_path, map_location="cpu", mmap=True, weights_only=True)
    else:
        position = checkpoint_path.tell()
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        checkpoint_path.seek(position)
    return dict(checkpoint.get(key, {}))


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
