"""``GeneratedTokenBudget``: end training once the run has generated a given number of completion tokens.

Methods that sample different amounts per step (dynamic sampling draws extra prompts and discards uninformative
groups; a larger group size N samples more per prompt) are compared fairly at equal generation cost, not at equal
step counts. The count is the collector's ``generated_tokens`` statistic of every step's rollout: every sampled
completion token, including those of groups that dynamic sampling drew and discarded, summed over all ranks.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from typing_extensions import override

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.batch import PromptBatch

TOTAL_KEY = "rollout/generated_tokens_total"


class GeneratedTokenBudget(L.Callback):
    """Stop ``fit`` after the step at which the run's generated completion tokens reach ``max_tokens``.

    The stop happens at a step boundary, so the run overshoots the budget by less than one step's generation; the
    exact total is logged as ``rollout/generated_tokens_total`` and kept in checkpoints, so a resumed run counts on
    from where it stopped. Lightning runs the validation loop when a callback stops training early, so the final
    pass@k is evaluated as at ``max_steps``.

    Args:
        max_tokens: The budget in completion tokens, summed over every rank (> 0).
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ConfigError(f"GeneratedTokenBudget.max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self.total = 0

    @property
    def reached(self) -> bool:
        """Whether the run has generated at least ``max_tokens`` tokens."""
        return self.total >= self.max_tokens

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A run resumed from a checkpoint taken after the budget was spent trains no further step.
        if self.reached:
            trainer.should_stop = True

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = batch.rollout if isinstance(batch, PromptBatch) else None
        local = float(rollout.stats.get("generated_tokens", 0.0)) if rollout is not None else 0.0
        # Each rank generated its own share of the step: the budget is on the sum (a collective on every rank).
        step_tokens = trainer.strategy.reduce(
            torch.tensor(local, dtype=torch.float64, device=pl_module.device), reduce_op="sum"
        )  # on the module's device: NCCL reduces CUDA tensors only
        self.total += int(round(float(step_tokens)))
        pl_module.log(TOTAL_KEY, float(self.total), on_step=True, on_epoch=False, batch_size=1)
        if self.reached:
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"generated_tokens_total": self.total}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = int(state_dict.get("generated_tokens_total", 0))
