"""Checkpoints that survive a kill, are checked before use, and resume into a config they agree with.

* :class:`AtomicCheckpointIO` writes each checkpoint to a temporary file in the *same* directory, fsyncs it and
  renames it over the target (``os.replace``), so a kill at any moment leaves either the old or the new checkpoint,
  never a truncated one, wherever the system's temporary directory lives. The CLI installs it
  (:func:`install_atomic_checkpoint_io`); with a plain ``Trainer`` pass ``plugins=[AtomicCheckpointIO()]``.
* :func:`load_checkpoint_checked` refuses an unreadable file (missing, 0 bytes, truncated, not a checkpoint) with
  its path and the reason.
* :func:`resolve_resume` is what ``--ckpt_path FILE`` and ``--ckpt_path last`` both go through: ``last`` becomes the
  newest *readable* checkpoint of the run's ``ModelCheckpoint`` folders (an unreadable newer one is skipped, and one
  warning names it, why, and the file taken instead), and the checkpoint's saved settings are compared with the config. **The config wins** for
  every setting (a warning lists each difference with both values), except the model's shape (``model``,
  ``model_config``, ``lora``, ``tokenizer``): weights cannot be loaded into another shape, so that is refused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_fgrpo.errors import CheckpointError
from lit_fgrpo.reporting.notices import notice
from lit_fgrpo.training.module_settings import GROUPS, grouped_settings

log = logging.getLogger(__name__)

SHAPE_KEYS = ("policy.model", "policy.model_config", "policy.lora", "policy.tokenizer")
"""Model settings that fix the weights' shapes: a checkpoint whose values differ is refused."""

_RESUME_KEYWORDS = ("best", "hpc", "registry")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose writes are atomic: temp file in the target's directory, fsync, ``os.replace``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        target = Path(path)
        if "://" in str(path):  # remote filesystems have their own semantics
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        try:
            with temp.open("wb") as handle:
                self._write(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def _write(self, checkpoint: dict[str, Any], handle: Any) -> None:
        """Serialise ``checkpoint`` into the open temporary file (a seam for tests that kill mid-write)."""
        torch.save(checkpoint, handle)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def install_atomic_checkpoint_io(trainer: Any) -> bool:
    """Use :class:`AtomicCheckpointIO` when the trainer's strategy has the default ``TorchCheckpointIO``."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
        return True
    return False


def load_checkpoint_checked(path: str | Path) -> dict[str, Any]:
    """Load a Lightning checkpoint on the CPU, or raise :class:`CheckpointError` naming the path and the reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: checkpoint is empty (0 bytes; an interrupted write?)")
    with path.open("rb") as handle:
        is_zip = handle.read(4) == b"PK\x03\x04"  # torch.save's format; mmap avoids a second copy in memory
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=is_zip)
    except Exception as err:  # truncated zip, pickle garbage, a text file: all "not a readable checkpoint"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(err).__name__}: {reason})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (no 'state_dict' entry)")
    return checkpoint


def checkpoint_dirs(trainer: Any) -> list[Path]:
    """The ``dirpath`` of each ``ModelCheckpoint`` of the trainer."""
    folders = []
    for callback in getattr(trainer, "checkpoint_callbacks", []):
        dirpath = getattr(callback, "dirpath", None)
        if dirpath:
            folders.append(Path(dirpath))
    return folders


def newest_readable_or_skipped(
    folders: list[Path],
) -> tuple[tuple[Path, dict[str, Any]] | None, list[CheckpointError]]:
    """The newest ``*.ckpt`` under ``folders`` that loads (or ``None``) and the errors of the newer ones it skipped.

    When it skips any and finds one, one warning names each skipped file, why, and the file taken instead.
    """
    candidates = sorted(
        (p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt") if p.is_file()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    skipped: list[CheckpointError] = []
    for path in candidates:
        try:
            checkpoint = load_checkpoint_checked(path)
        except CheckpointError as err:
            skipped.append(err)
            continue
        if skipped:
            notice(
                log,
                "--ckpt_path last: skipping the unreadable %s; resuming from %s instead",
                " and ".join(str(err) for err in skipped),
                path,
            )
        return (path, checkpoint), skipped
    return None, skipped


def _plain(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _leaves(settings: dict[str, Any], groups: Any = GROUPS) -> dict[str, Any]:
    # {"optimizer": {"lr": 1e-3}, "val_pass_at_k": [1]} -> {"optimizer.lr": 1e-3, "val_pass_at_k": [1]}
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key in groups and isinstance(value, dict):
            flat |= {f"{key}.{name}": item for name, item in value.items()}
        else:
            flat[key] = value
    return flat


def compare_settings(saved: dict[str, Any], config: dict[str, Any], prefix: str, path: Path) -> list[str]:
    """Differences between a checkpoint's saved settings and the config, as ``--prefix.key (checkpoint X, config Y)``.

    Raises:
        CheckpointError: If a :data:`SHAPE_KEYS` setting of the model differs.
    """
    saved, config = _plain(saved), _plain(config)
    if prefix == "model":  # compared per setting of each group; a checkpoint from before the groups is migrated
        saved, config = _leaves(grouped_settings(saved)), _leaves(grouped_settings(config))
    elif prefix == "data":  # the data module's groups, likewise
        from lit_fgrpo.data.data_settings import grouped_data_settings, settings_groups

        saved = _leaves(grouped_data_settings(saved), settings_groups())
        config = _leaves(grouped_data_settings(config), settings_groups())
    differences = []
    for key in sorted(set(saved) & set(config)):
        if saved[key] == config[key]:
            continue
        if prefix == "model" and key in SHAPE_KEYS:
            raise CheckpointError(
                f"{path}: --model.{key} differs from the checkpoint (checkpoint: {saved[key]!r}, config: "
                f"{config[key]!r}); the weights cannot be loaded into another model shape",
                hint="resume with the checkpoint's model settings, or start a new run",
            )
        differences.append(f"--{prefix}.{key} (checkpoint {saved[key]!r}, config {config[key]!r})")
    return differences


def resolve_resume(
    ckpt_path: str, trainer: Any, model_config: Any = None, data_config: Any = None, subcommand: str = "fit"
) -> str | None:
    """Check the checkpoint a run resumes from and return the file to pass to ``trainer.fit(ckpt_path=...)``.

    Args:
        ckpt_path: A file, ``"last"`` (the newest readable checkpoint of the ``ModelCheckpoint`` folders), or another
            Lightning keyword, passed through unchecked.
        trainer: The trainer (for its checkpoint folders).
        model_config: The config's model init arguments, compared with the checkpoint's ``hyper_parameters``.
        data_config: The config's data init arguments, compared with ``datamodule_hyper_parameters``.
        subcommand: ``fit`` starts from scratch when ``"last"`` finds no checkpoint; ``validate`` and ``test``
            refuse (they would evaluate an untrained policy).

    Returns:
        The checkpoint file, or ``None`` for ``"last"`` when no checkpoint exists yet (a fresh start, logged).

    Raises:
        CheckpointError: If the file is unreadable, every checkpoint under the folders is, or the model shape differs.
    """
    if ckpt_path in _RESUME_KEYWORDS:
        return ckpt_path
    if ckpt_path == "last":
        folders = checkpoint_dirs(trainer)
        found, skipped = newest_readable_or_skipped(folders)
        if found is None:
            if skipped:
                names = ", ".join(str(f) for f in folders)
                reasons = "; ".join(str(err) for err in skipped)
                raise CheckpointError(f"--ckpt_path last: no readable checkpoint in {names} ({reasons})")
            if subcommand != "fit":
                where = f"in {', '.join(str(f) for f in folders)}" if folders else "(no ModelCheckpoint folder)"
                raise CheckpointError(
                    f"--ckpt_path last: no checkpoint to {subcommand} {where}",
                    hint="give the checkpoint file: --ckpt_path path/to/last.ckpt",
                )
            notice(log, "--ckpt_path last: no checkpoint in %s yet; starting from scratch", [str(f) for f in folders])
            return None
        path, checkpoint = found
    else:
        path = Path(ckpt_path)
        checkpoint = load_checkpoint_checked(path)
    differences: list[str] = []
    if model_config is not None:
        differences += compare_settings(checkpoint.get("hyper_parameters", {}), model_config, "model", path)
    if data_config is not None:
        differences += compare_settings(checkpoint.get("datamodule_hyper_parameters", {}), data_config, "data", path)
    if differences:
        notice(log, "resuming %s: the config's value wins for %s", path, "; ".join(differences))
    return str(path)
