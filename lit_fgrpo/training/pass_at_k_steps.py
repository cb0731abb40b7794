"""``PassAtKSteps``: the validation and test steps of a module whose batches carry scored rollouts.

Each held-out batch arrives with ``batch.rollout`` (attached by :class:`~lit_fgrpo.callbacks.RolloutCallback`); the
unbiased pass@k of its groups accumulates over the epoch and is logged as ``val/pass_at_k`` or ``test/pass_at_k``
at its end (``val/pass_at_1`` also on the progress bar), with the mean reward (``val/reward_mean``). A multi-turn
episode is solved by its final verdict (the rollout's ``correct``); the share right at their first reply is logged as
``val/correct_first_turn``, and where the environments have tools the share with a valid tool call as ``val/tool_use``.

Every value is logged as a torchmetrics ``Metric`` (:func:`held_out_metrics`), not as a number: Lightning computes
it at the epoch's end, where torchmetrics sums its states over the ranks first (pass@k over every rank's problems,
each mean weighted by every rank's prompts or rows), and resets it. A number logged with ``sync_dist=True`` would be
reduced only under a distributed strategy; in a one-device run beside an in-process vLLM engine (whose own
one-process group makes Lightning think the run is distributed) Lightning advised ``sync_dist`` on every epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric
from typing_extensions import override

from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.episodes import EPISODE_SHARES

REWARD_MEAN = "reward_mean"


class WeightedMean(Metric):
    """The mean of per-batch values, each weighted by its batch's size; states summed over ranks (NaN propagates:
    a batch whose rewards are all NaN makes the epoch's mean NaN, as Lightning's own mean did)."""

    full_state_update = False
    total: Tensor
    weight: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: float, weight: int) -> None:  # type: ignore[override]
        """Add one batch's mean ``value`` over ``weight`` items."""
        self.total += float(value) * weight
        self.weight += weight

    def compute(self) -> Tensor:  # type: ignore[override]
        """The weighted mean of every batch seen, on every rank."""
        return (self.total / self.weight).float()


def held_out_metrics(ks: Sequence[int]) -> nn.ModuleDict:
    """One metric per held-out value: ``pass_at_<k>`` for each k and the half-width of its 95 % interval over the
    questions, ``ci95_pass_at_<k>`` (:class:`~lit_fgrpo.metrics.PassAtK`), the reward mean and the episodes' shares
    (right at the first turn, with a valid tool call: :data:`~lit_fgrpo.rollout.episodes.EPISODE_SHARES`), each a
    :class:`WeightedMean`."""
    metrics: dict[str, Metric] = {f"pass_at_{k}": PassAtK(int(k)) for k in ks}
    metrics |= {f"ci95_pass_at_{k}": PassAtK(int(k), statistic="ci95") for k in ks}
    metrics |= {name: WeightedMean() for name in (REWARD_MEAN, *EPISODE_SHARES)}
    return nn.ModuleDict(metrics)


class PassAtKSteps(L.LightningModule):
    """Validation/test steps that accumulate and log pass@k (mixed into :class:`~lit_fgrpo.training.module.FGRPOModule`)."""

    held_out: nn.ModuleDict
    """The held-out metrics (:func:`held_out_metrics`), built by the module."""

    def _log_held_out(self, split: str, rollout: RolloutBatch) -> None:
        """Update and log (for the epoch's end) every held-out value of one batch under ``{split}/``."""
        for name, metric in self.held_out.items():
            if isinstance(metric, PassAtK):
                metric.update(rollout.correct)
                self.log(f"{split}/{name}", metric, prog_bar=split == "val" and name == "pass_at_1")
        if split != "val":
            return
        reward_mean = cast(WeightedMean, self.held_out[REWARD_MEAN])
        reward_mean.update(float(torch.nanmean(rollout.rewards)), rollout.num_prompts)
        self.log(f"val/{REWARD_MEAN}", reward_mean)
        for name in (n for n in EPISODE_SHARES if n in rollout.stats):
            share = cast(WeightedMean, self.held_out[name])
            share.update(float(rollout.stats[name]), rollout.num_prompts * rollout.group_size)
            self.log(f"val/{name}", share)

    @override
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._log_held_out("val", batch.take_rollout())

    @override
    def test_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._log_held_out("test", batch.take_rollout())
