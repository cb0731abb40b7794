"""``FocalFigureCallback``: per-group success rates of every RL step, drawn at the end of fit.

Data it needs from each training rollout batch: ``RolloutBatch.correct`` (P, G) bool verdicts and
``RolloutBatch.rewards`` (P, G) (NaN marks an unscorable completion). The success rate of a group is the mean of
``correct`` over its scorable completions, mu_hat = sum_g c_g v_g / sum_g v_g (v = ~isnan(rewards)), the same
mu_hat that sets the focal weight g = (1 - mu_hat)^gamma.

It reads them through the batch seam: the training batch is a :class:`~lit_fgrpo.rollout.batch.PromptBatch`
whose ``rollout`` the :class:`~lit_fgrpo.callbacks.RolloutCallback` attached before ``training_step``, and which
``training_step`` reads without detaching (``PromptBatch.take_rollout``), so ``on_train_batch_end`` receives the very
rollout that was trained on. A batch without a rollout records nothing. :meth:`observe` is the seam for anything
else that has the verdicts.

With several ranks each rank sees its own prompts; the figure (drawn on rank 0) shows rank 0's groups, a
1/world_size sample of every step's groups.
"""

from __future__ import annotations

from typing import Any, cast

import lightning as L
import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lit_fgrpo.reporting.artifacts import log_figure
from lit_fgrpo.reporting.focal_figure import focal_figure
from lit_fgrpo.rollout.batch import PromptBatch
from lit_fgrpo.rollout.consumer import RolloutConsumer, missing_members


def group_success_rates(correct: Tensor, rewards: Tensor | None = None) -> np.ndarray:
    """(P,) mu_hat of each group: mean of ``correct`` over the scorable (non-NaN reward) completions; NaN if none."""
    valid = torch.ones_like(correct, dtype=torch.bool) if rewards is None else ~torch.isnan(rewards)  # (P, G)
    hits = (correct.bool() & valid).sum(dim=1).double()  # (P,)
    counts = valid.sum(dim=1).double()  # (P,)
    rates = torch.where(counts > 0, hits / counts.clamp(min=1), torch.full_like(hits, float("nan")))  # (P,)
    return rates.cpu().numpy()


class FocalFigureCallback(L.Callback):
    """Collect mu_hat per group at every step; log ``figures/focal.png`` at the end of fit.

    Args:
        artifact_file: the figure's name in the run.
        bins: histogram bins of the success-rate panel.
    """

    def __init__(self, artifact_file: str = "figures/focal.png", bins: int = 10) -> None:
        if bins < 1:
            raise ValueError(f"FocalFigureCallback.bins must be >= 1, got {bins}")
        self.artifact_file, self.bins = artifact_file, bins
        self.group_size = 1
        self.steps: list[int] = []
        self.success_rates: list[np.ndarray] = []

    def observe(self, step: int, correct: Tensor, rewards: Tensor | None = None) -> None:
        """Record the (P, G) verdicts of the rollout batch trained on at ``step``."""
        self.steps.append(int(step))
        self.success_rates.append(group_success_rates(correct.detach(), None if rewards is None else rewards.detach()))

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(batch, PromptBatch) and batch.rollout is not None:
            self.group_size = batch.rollout.group_size
            self.observe(trainer.global_step, batch.rollout.correct, batch.rollout.rewards)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.steps or not trainer.is_global_zero:
            return
        if not missing_members(pl_module, RolloutConsumer):
            # the weight the advantages were multiplied by (focal with gamma, or the group_weight hook)
            weight = cast(RolloutConsumer, pl_module).group_weight
            size = torch.tensor(float(self.group_size))

            def weight_of_mu(mu: np.ndarray) -> np.ndarray:
                rates = torch.as_tensor(mu, dtype=torch.float64)
                return weight(rates, size.expand_as(rates).to(torch.float64)).numpy()

            label = f"gamma = {weight.gamma:g}" if weight.kind == "focal" else weight.kind
            figure = focal_figure(self.steps, self.success_rates, weight_of_mu, bins=self.bins, weight_label=label)
        else:
            figure = focal_figure(self.steps, self.success_rates, 0.0, bins=self.bins)
        log_figure(trainer.logger, figure, self.artifact_file)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "success_rates": [r.tolist() for r in self.success_rates]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = list(state_dict.get("steps", []))
        self.success_rates = [np.asarray(r, dtype=float) for r in state_dict.get("success_rates", [])]
