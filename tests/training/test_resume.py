"""An interrupted run resumed with ckpt_path matches an uninterrupted run: data position, optimizer, sampling."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_fgrpo.callbacks import RNGStateCallback, RolloutCallback, WarmStartCallback
from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.rollout.base import SamplingConfig
from tests.training.tiny_setup import tiny_module


def fit(tmp: Path, max_steps: int, ckpt_path: str | None = None) -> tuple[torch.nn.Module, RolloutCallback]:
    data = PromptDataModule(
        source="maze",
        num_train=64,
        num_val=4,
        num_test=4,
        val_size=4,
        prompts_per_step=4,
        tokenizer_path="builtin:maze",
    )
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, max_tokens=8, stop_token_ids=[7]),
        val_samples=4,
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
        log_samples_every=0,
    )
    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=[
            WarmStartCallback(steps=3, batch_size=8),
            rollout,
            RNGStateCallback(),
            checkpoint,
        ],  # must not rerun on resume
        logger=False,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
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
