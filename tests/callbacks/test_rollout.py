"""RolloutCallback's metrics in a Trainer run with two optimizer steps per batch: each lands on its step.

The rollout side logs through one function, the trainer logger's ``log_metrics``, at the step each call brings: a
weight push at the optimizer step it follows (0 for the start's push, then 2, 4, 6). What it measures of a batch
(the collector's statistics, an asynchronous batch's staleness, the schedule's phases) is logged by the module with
the update's metrics, on Lightning's step of that batch (0, 1, 2).
"""

from __future__ import annotations

from typing import Any

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.rollout import SamplingConfig
from tests.training.tiny_setup import MemoryLogger, maze_data, quiet_trainer, tiny_module


def fit(**rollout: Any) -> MemoryLogger:
    logger = MemoryLogger()
    callback = RolloutCallback(
        engine="hf_copy",
        sampling=SamplingConfig(n=4, max_tokens=8, stop_token_ids=[7]),
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
        **rollout,
    )
    trainer = quiet_trainer(6, [callback], logger=logger, log_every_n_steps=1)
    module = tiny_module(num_iterations=2, importance_correction="token")  # 2 optimizer steps per batch: 3 batches
    trainer.fit(module, maze_data(num_train=32))
    return logger


def steps(logger: MemoryLogger, key: str) -> list[int]:
    return [step for step, _ in logger.points(key)]


def test_pushes_at_their_optimizer_step_and_the_batch_statistics_at_lightnings() -> None:
    logger = fit()
    assert steps(logger, "rollout/sync_seconds") == [0, 2, 4, 6]  # the start's push, then after each batch
    assert steps(logger, "rollout/sync_logprob_delta") == [0, 2, 4, 6]
    for key in ("rollout/generation_seconds", "rollout/reward_mean", "time/generate", "time/sync", "train/loss"):
        assert steps(logger, key) == [0, 1, 2], key


def test_an_asynchronous_batch_carries_its_staleness_to_the_update_metrics() -> None:
    logger = fit(max_staleness=1)
    assert logger.points("rollout/staleness") == [(0, 0.0), (1, 1.0), (2, 1.0)]
    assert logger.points("rollout/policy_version") == [(0, 0.0), (1, 0.0), (2, 1.0)]
    for key in ("rollout/staleness_max", "rollout/dropped_stale", "time/wait_trainer", "time/wait_engine"):
        assert steps(logger, key) == [0, 1, 2], key
    assert steps(logger, "rollout/sync_seconds") == [0, 2, 4, 6]
