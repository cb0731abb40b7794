"""A run killed after its last checkpoint and before its final validation and export ends, on resume, as if uninterrupted.

The last checkpoint is written in ``on_train_batch_end`` of the last step, before the validation after it; a copy
of it in a fresh folder is exactly what a process killed at that moment leaves. Resuming from it must log the same
``val/*`` at the last step and the same ``final/*``, and export the same policy files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file

from lit_fgrpo.callbacks import FocalFigureCallback, PassAtKReport
from lit_fgrpo.training.checkpointing import AtomicCheckpointIO
from tests.training.tiny_setup import MemoryLogger, maze_data, quiet_trainer, tiny_module, word_count_rollouts


def fit(folder: Path, steps: int, val_every: int, ckpt_path: str | None = None) -> MemoryLogger:
    """A tiny F-GRPO run of ``steps`` steps, a checkpoint every step, validation every ``val_every`` steps, export."""
    logger = MemoryLogger()
    checkpoint = ModelCheckpoint(dirpath=folder / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    callbacks: list[Any] = [
        word_count_rollouts(validate_at_start=True),
        PassAtKReport(),
        FocalFigureCallback(),
        checkpoint,
    ]
    trainer = quiet_trainer(
        steps, callbacks, logger=logger, limit_val_batches=None, val_check_interval=val_every,
        check_val_every_n_epoch=None, plugins=[AtomicCheckpointIO()],
    )  # fmt: skip
    module = tiny_module(val_pass_at_k=[1, 4], save_pretrained_dir=str(folder / "policy"))
    trainer.fit(module, maze_data(), ckpt_path=ckpt_path)
    focal = callbacks[2]
    logger.rows.append(
        (
            -1,
            {f"focal/step{s}/{i}": float(v) for s, r in zip(focal.steps, focal.success_rates) for i, v in enumerate(r)},
        )
    )
    return logger


def ending(logger: MemoryLogger, steps: int) -> dict[str, list[tuple[int, float]]]:
    """Every ``final/*`` point, the ``val/*`` points of the last step (Lightning logs them at ``steps - 1``) and the
    focal figure's per-step success rates (``focal/*``, recorded by :func:`fit`)."""
    keys = {key for _, metrics in logger.rows for key in metrics if key.startswith(("final/", "val/", "focal/"))}
    points = {
        key: [p for p in logger.points(key) if key.startswith(("final/", "focal/")) or p[0] >= steps - 1]
        for key in keys
    }
    return {key: value for key, value in sorted(points.items()) if value}


def policy_files(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights |= load_file(str(shard))
    return weights, json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize(
    ("steps", "val_every"), [(2, 2), (3, 2)], ids=["validation_due_at_the_end", "last_validation_before_the_end"]
)
def test_resume_after_the_last_checkpoint_finishes_the_run(tmp_path: Path, steps: int, val_every: int) -> None:
    straight = fit(tmp_path / "straight", steps, val_every)
    killed = tmp_path / "killed"
    (killed / "ckpt").mkdir(parents=True)
    last = tmp_path / "straight" / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == steps
    shutil.copy(last, killed / "ckpt" / "last.ckpt")  # what a kill between the checkpoint and the ending leaves

    resumed = fit(killed, steps, val_every, ckpt_path=str(killed / "ckpt" / "last.ckpt"))

    expected = ending(straight, steps)
    assert any(key.startswith("final/pass_at_") for key in expected), expected
    assert any(key.startswith("val/") for key in expected) == (steps % val_every == 0), expected
    assert ending(resumed, steps) == expected
    weights, config = policy_files(tmp_path / "straight" / "policy")
    resumed_weights, resumed_config = policy_files(killed / "policy")
    assert resumed_config == config and weights.keys() == resumed_weights.keys()
    for name, value in weights.items():
        torch.testing.assert_close(resumed_weights[name], value, rtol=0, atol=0, msg=name)
    assert sorted(p.name for p in (killed / "policy").iterdir()) == sorted(
        p.name for p in (tmp_path / "straight" / "policy").iterdir()
    )
