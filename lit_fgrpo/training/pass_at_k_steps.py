"""``PassAtKSteps``: the validation and test steps of a module whose batches carry scored rollouts.

Each held-out batch arrives with ``batch.rollout`` (attached by :class:`~lit_fgrpo.callbacks.RolloutCallback`); the
unbiased pass@k of its groups accumulates in ``pass_at_k`` over the epoch and is logged as ``val/pass_at_k`` or
``test/pass_at_k`` at its end (``val/pass_at_1`` also on the progress bar).
"""

from __future__ import annotations

import lightning as L
import torch
from typing_extensions import override

from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.rollout.batch import PromptBatch


class PassAtKSteps(L.LightningModule):
    """Validation/test steps that accumulate and log pass@k (mixed into :class:`~lit_fgrpo.training.module.FGRPOModule`)."""

    pass_at_k: PassAtK

    @override
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        rollout = batch.take_rollout()
        self.pass_at_k.update(rollout.correct)
        reward = float(torch.nanmean(rollout.rewards))
        self.log("val/reward_mean", reward, batch_size=rollout.num_prompts, sync_dist=True)

    def _log_pass_at_k(self, split: str) -> None:
        """Log ``{split}/pass_at_k`` accumulated over the epoch and reset (nothing when no problem was seen)."""
        if float(self.pass_at_k.num_problems) == 0:
            return
        values = self.pass_at_k.compute()
        assert isinstance(values, dict)  # built with a list of k
        for name, value in values.items():
            self.log(f"{split}/{name}", value.float(), prog_bar=split == "val" and name == "pass_at_1")
        self.pass_at_k.reset()

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_pass_at_k("val")

    @override
    def test_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self.pass_at_k.update(batch.take_rollout().correct)

    @override
    def on_test_epoch_end(self) -> None:
        self._log_pass_at_k("test")
