"""Group 5: unreadable checkpoints refused by path and reason; resume settings compared; writes atomic."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_fgrpo.errors import CheckpointError
from lit_fgrpo.training.checkpointing import AtomicCheckpointIO, load_checkpoint_checked, resolve_resume

HPARAMS = {"model_config": {"hidden_size": 32}, "lr": 1e-3, "gamma": 0.5}
"""Saved flat, as checkpoints from before the settings groups: compared with the config's groups after migration."""
CONFIG = {"policy": {"model_config": {"hidden_size": 32}}, "optimizer": {"lr": 1e-3}, "objective": {"gamma": 0.5}}


def save(path: Path, **extra: Any) -> Path:
    torch.save({"state_dict": {"w": torch.ones(3)}, "hyper_parameters": dict(HPARAMS), **extra}, path)
    return path


def test_empty_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    path.touch()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_checked(path)
    assert str(info.value) == f"{path}: checkpoint is empty (0 bytes; an interrupted write?)"


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = save(tmp_path / "a.ckpt")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=rf"^{path}: not a readable checkpoint \(RuntimeError: "):
        load_checkpoint_checked(path)


def test_text_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.ckpt"
    path.write_text("model: 7b\n")
    with pytest.raises(CheckpointError, match=rf"^{path}: not a readable checkpoint \(UnpicklingError: "):
        load_checkpoint_checked(path)


def test_plain_tensor_file_is_not_a_lightning_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_checked(path)
    assert str(info.value) == f"{path}: not a Lightning checkpoint (no 'state_dict' entry)"


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        resolve_resume(str(tmp_path / "absent.ckpt"), SimpleNamespace(checkpoint_callbacks=[]))


def trainer_for(folder: Path) -> Any:
    return SimpleNamespace(checkpoint_callbacks=[ModelCheckpoint(dirpath=folder)])


def test_last_falls_back_to_the_newest_readable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = save(tmp_path / "step=2.ckpt")
    bad = tmp_path / "last.ckpt"
    bad.touch()
    os.utime(good, (1, 1))  # the 0-byte last.ckpt is newer
    with caplog.at_level(logging.WARNING):
        assert resolve_resume("last", trainer_for(tmp_path)) == str(good)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"--ckpt_path last: skipping the unreadable {bad}: checkpoint is empty (0 bytes; an interrupted write?); "
        f"resuming from {good} instead"
    ]


def test_fallback_is_on_the_terminal_when_logging_is_silenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's Alembic migrations disable existing loggers (fileConfig); the fallback must still be seen."""
    good = save(tmp_path / "step=2.ckpt")
    bad = tmp_path / "last.ckpt"
    bad.touch()
    os.utime(good, (1, 1))
    monkeypatch.setattr(logging.getLogger("lit_fgrpo.training.checkpointing"), "disabled", True)
    assert resolve_resume("last", trainer_for(tmp_path)) == str(good)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"warning: --ckpt_path last: skipping the unreadable {bad}: checkpoint is empty (0 bytes; an interrupted "
        f"write?); resuming from {good} instead"
    ]


def test_last_with_only_unreadable_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").touch()
    with pytest.raises(CheckpointError) as info:
        resolve_resume("last", trainer_for(tmp_path))
    assert str(info.value) == (
        f"--ckpt_path last: no readable checkpoint in {tmp_path} "
        f"({tmp_path / 'last.ckpt'}: checkpoint is empty (0 bytes; an interrupted write?))"
    )


def test_last_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    assert resolve_resume("last", trainer_for(tmp_path / "none")) is None


def test_model_shape_change_is_refused(tmp_path: Path) -> None:
    path = save(tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError) as info:
        resolve_resume(str(path), trainer_for(tmp_path), CONFIG | {"policy": {"model_config": {"hidden_size": 64}}})
    assert str(info.value) == (
        f"{path}: --model.policy.model_config differs from the checkpoint (checkpoint: {{'hidden_size': 32}}, config: "
        "{'hidden_size': 64}); the weights cannot be loaded into another model shape"
    )


@pytest.mark.parametrize("how", ["file", "last"])
def test_other_settings_config_wins_for_file_and_last(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the data settings saved flat too (before the data module's groups), the config's grouped
    path = save(tmp_path / "last.ckpt", datamodule_hyper_parameters={"num_train": 300, "maze_rows": 4, "seed": 0})
    with caplog.at_level(logging.WARNING):
        got = resolve_resume(
            str(path) if how == "file" else "last",
            trainer_for(tmp_path),
            CONFIG | {"optimizer": {"lr": 2e-3}},
            {"splits": {"num_train": 200}, "maze": {"rows": 4}, "seed": 0},
        )
    assert got == str(path)
    assert (
        f"resuming {path}: the config's value wins for --model.optimizer.lr (checkpoint 0.001, config 0.002); "
        "--data.splits.num_train (checkpoint 300, config 200)\n"
    ) in caplog.text + "\n"


class FailingIO(AtomicCheckpointIO):
    """Dies half-way through writing (a full disk, or a kill, as far as the files on disk can tell)."""

    def _write(self, checkpoint: dict[str, Any], handle: Any) -> None:
        handle.write(b"PK\x03\x04half")
        raise OSError("No space left on device")


def test_failed_write_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1)}}, target)
    before = target.read_bytes()
    with pytest.raises(OSError, match="No space left"):
        FailingIO().save_checkpoint({"state_dict": {"w": torch.zeros(1)}}, target)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.equal(load_checkpoint_checked(target)["state_dict"]["w"], torch.ones(1))
