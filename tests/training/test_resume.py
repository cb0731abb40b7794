"""An interrupted run resumed with ckpt_path matches an uninterrupted run: data position, optimizer, sampling."""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_fgrpo.callbacks import RNGStateCallback, RolloutCallback, WarmStartCallback
from tests.training.tiny_setup import maze_data, quiet_trainer, tiny_module, word_count_rollouts


def fit(tmp: Path, max_steps: int, ckpt_path: str | None = None) -> tuple[torch.nn.Module, RolloutCallback]:
    data = maze_data()
    rollout = word_count_rollouts()
    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    # the warm start must not rerun on resume
    trainer = quiet_trainer(
        max_steps, [WarmStartCallback(steps=3, batch_size=8), rollout, RNGStateCallback(), checkpoint]
    )
    module = tiny_module(lr=1e-2, gamma=0.5)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return module.policy, rollout


def test_resume_matches_uninterrupted(tmp_path: Path) -> None:
    straight, _ = fit(tmp_path / "a", max_steps=4)
    fit(tmp_path / "b", max_steps=2)  # "interrupted" after 2 steps, checkpoint on disk
    resumed, callback = fit(tmp_path / "b", max_steps=4, ckpt_path=str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    assert callback.last_sync_step == 4
    moved = False
    initial = tiny_module().policy.state_dict()
    for (name, p), (_, q) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
        moved |= not torch.equal(p, initial[name])
    assert moved, "the policy never changed: the test could not tell a resume from a fresh start"
