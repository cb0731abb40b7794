"""GeneratedTokenBudget on the real Trainer: it stops at the first step whose running total reaches the budget,
counts what the rollouts generated, and resumes its count from a checkpoint. (Two DDP ranks: the budget's total is
among the logged statistics that tests/distributed/test_lightning_launch.py compares with one process.)"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_fgrpo.callbacks import GeneratedTokenBudget
from lit_fgrpo.errors import ConfigError
from tests.training.tiny_setup import maze_data, quiet_trainer, tiny_module, word_count_rollouts

pytestmark = pytest.mark.slow


class CountTokens(L.Callback):
    """The reference count: the completion tokens of every step's rollout, read from the batch itself."""

    def __init__(self) -> None:
        self.per_step: list[int] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.per_step.append(sum(len(ids) for ids in batch.rollout.completion_ids))


def fit(max_steps: int, budget: GeneratedTokenBudget, *extra: L.Callback, ckpt: str | None = None) -> CountTokens:
    counter = CountTokens()
    trainer = quiet_trainer(max_steps, [word_count_rollouts(seed=3), budget, counter, *extra])
    trainer.fit(tiny_module(seed=0), datamodule=maze_data(), ckpt_path=ckpt)
    return counter


def test_stops_at_the_first_step_that_reaches_the_budget() -> None:
    free = fit(4, GeneratedTokenBudget(10**9))
    totals = list(itertools.accumulate(free.per_step))
    assert min(free.per_step) > 0
    budget = GeneratedTokenBudget(totals[1] + 1)  # reached during step 3, not before
    capped = fit(4, budget)
    assert capped.per_step == free.per_step[:3]  # the same rollouts, one step fewer
    assert budget.total == totals[2] and budget.reached


def test_budget_count_survives_a_checkpoint(tmp_path: Path) -> None:
    whole = GeneratedTokenBudget(10**9)
    fit(3, whole)
    first = GeneratedTokenBudget(10**9)
    fit(2, first, ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0, every_n_train_steps=2))
    resumed = GeneratedTokenBudget(10**9)
    fit(3, resumed, ckpt=str(tmp_path / "last.ckpt"))
    assert resumed.total == whole.total > first.total > 0


def test_a_run_resumed_with_its_budget_spent_trains_no_step(tmp_path: Path) -> None:
    first = GeneratedTokenBudget(1)  # spent by the first step
    fit(3, first, ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0, every_n_train_steps=1))
    resumed = GeneratedTokenBudget(1)
    counter = fit(3, resumed, ckpt=str(tmp_path / "last.ckpt"))
    assert counter.per_step == [] and resumed.total == first.total > 0


def test_budget_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_tokens must be >= 1"):
        GeneratedTokenBudget(0)
