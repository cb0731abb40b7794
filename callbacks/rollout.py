"""``RolloutCallback``: the Lightning glue of a :class:`~lit_fgrpo.rollout.source.RolloutSource`.

Each hook turns the trainer's state into one call on the source, which owns the engine, its weight pushes, the
collector and the mode's schedule (synchronous, dynamic sampling, asynchronous). The rollout is attached to the
:class:`~lit_fgrpo.rollout.batch.PromptBatch` that ``training_step`` receives (``batch.rollout``); the module is
read through :class:`RolloutConsumer` only. Settings: :class:`~lit_fgrpo.rollout.rollout_settings.RolloutSettings`.
The engine is built at the first stage start (after ``configure_model``) and marked stale at every stage start and
restore, so the first rollout pushes the (warm-started or restored) weights before it samples.

Each call carries the trainer's step, the module's step timer and one logging function, the trainer logger's
``log_metrics``: the weight pushes and the held-out pass@k before RL are logged through it at their step. What the
rollout side measures of a training batch (the collector's timings and counts, dynamic sampling's counts, an
asynchronous batch's staleness) rides on the batch's ``rollout.stats`` and is logged by the module with the update.
"""

from __future__ import annotations

from typing import Any, cast

import lightning as L
from typing_extensions import override

from lit_fgrpo.engines.base import RolloutEngine
from lit_fgrpo.rollout.async_schedule import AsyncRollouts
from lit_fgrpo.rollout.batch import PromptBatch
from lit_fgrpo.rollout.consumer import RolloutConsumer, check_consumer
from lit_fgrpo.rollout.episodes import TOOL_USE
from lit_fgrpo.rollout.rollout_settings import TEST_STREAM, TRAIN_STREAM, VAL_STREAM, RolloutSettings
from lit_fgrpo.rollout.schedule import LogFn, StepContext, no_log
from lit_fgrpo.rollout.source import RolloutSource, validation_batches

REPORTED = ("pass_at_", "ci95_pass_at_", TOOL_USE)
"""The held-out values the before/after report shows (the prefixes of their names)."""


class RolloutCallback(L.Callback):
    """Attach scored rollouts to every train/validation/test batch (see :class:`RolloutSettings` for every setting).

    Args:
        settings: all settings at once (what the CLI's ``rollout:`` group builds).
        **overrides: single settings by name, e.g. ``RolloutCallback(engine="hf_copy", max_staleness=1)``.
    """

    def __init__(self, settings: RolloutSettings | None = None, **overrides: Any) -> None:
        self.settings = RolloutSettings.with_overrides(settings, overrides)
        self.source = RolloutSource(self.settings)
        self.start_pass_at_k: dict[str, float] = {}
        """Held-out pass@k before the first RL step (``validate_at_start``) and its intervals (``ci95_pass_at_<k>``);
        reported by ``PassAtKReport``."""
        self.log: LogFn = no_log
        """Where the rollout side's metrics go: the trainer's logger (set at setup)."""

    # ------------------------------------------------------------------ what other code reads
    @property
    def engine(self) -> RolloutEngine | None:
        """The generation engine (None before the first stage start and after teardown)."""
        return self.source.engine

    @property
    def last_sync_step(self) -> int:
        """The global step of the last weight push (-1: none yet)."""
        return self.source.last_sync_step

    @property
    def async_rollouts(self) -> AsyncRollouts | None:
        """The asynchronous schedule with ``max_staleness >= 1``; None on the synchronous path."""
        return self.source.asynchronous

    def evaluate_held_out(
        self, trainer: L.Trainer, pl_module: L.LightningModule, label: str = "pass@k before RL"
    ) -> dict[str, float]:
        """Held-out pass@k of the policy as it is now, over every validation batch (after a push if the engine may
        hold other weights), with the intervals and the episodes' shares (:meth:`RolloutSource.evaluate`); nothing
        logged. Every rank calls it (the values are reduced over the ranks)."""
        batches = self._validation_batches_after_push(trainer, pl_module)
        ks = cast(RolloutConsumer, pl_module).pass_at_k_ks
        return self.source.evaluate(batches, ks, trainer.global_step, pl_module.device, label)

    def _validation_batches_after_push(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Any]:
        """The validation batches, once the engine holds the policy's weights (probed on a validation prompt when
        there is one)."""
        batches = validation_batches(datamodule_of(trainer))
        probe = [record.prompt_ids for record in (list(batches[0])[:2] if batches else [])]
        self.source.push_if_stale(self.step_context(trainer, pl_module), probe)
        return list(batches)

    def policy_changed(self) -> None:
        """The policy's weights changed outside RL (a warm start after an evaluation): push before the next sample."""
        self.source.mark_stale()

    def step_context(self, trainer: L.Trainer, pl_module: L.LightningModule) -> StepContext:
        """The trainer's state for one call of the source: step, ranks, data module, the module's timer, the log."""
        timer = cast(RolloutConsumer, pl_module).timer
        return StepContext(trainer.global_step, trainer.world_size, datamodule_of(trainer), timer, self.log)

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_consumer(pl_module, RolloutConsumer, "RolloutCallback")  # by name: reading `policy` would build it
        consumer = cast(RolloutConsumer, pl_module)
        self.settings.check_consumer(consumer)
        self.log = trainer.logger.log_metrics if trainer.logger is not None else no_log
        self.source.bind(consumer)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.source.close()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.source.stop()  # a generator thread must not outlive the run

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.source.start(datamodule_of(trainer))

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # validate(ckpt_path=...) and test(ckpt_path=...) restore after setup: stale then
        self.source.prepare(restored=trainer.state.fn != "fit")

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.on_validation_start(trainer, pl_module)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.settings.validate_at_start and trainer.global_step == 0:
            # pushes first, so that it samples from the trained-from policy (warm-started or restored)
            values = self.evaluate_held_out(trainer, pl_module)
            # the before/after report is pass@k's and the tool-call share's; other held-out values (an episode's
            # first turn) are only logged
            self.start_pass_at_k = {k: v for k, v in values.items() if k.startswith(REPORTED)}
            if values:
                self.log({f"val/{k}": v for k, v in values.items()}, 0)
        else:
            self._validation_batches_after_push(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert isinstance(batch, PromptBatch), "the module's on_after_batch_transfer must return a PromptBatch"
        batch.rollout = self.source.take(batch, self.step_context(trainer, pl_module))

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.source.after_step(self.step_context(trainer, pl_module))

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        assert isinstance(batch, PromptBatch), "the module's on_after_batch_transfer must return a PromptBatch"
        stream = TEST_STREAM if trainer.testing else VAL_STREAM
        call = self.step_context(trainer, pl_module)
        batch.rollout = self.source.evaluation(batch, call, stream, trainer.state.fn == "fit")
        if evaluation_loop(trainer).batch_progress.is_last_batch:
            # An engine shared by the ranks serves the other ranks' remaining batches now: before this rank's epoch
            # end, whose metric reductions (Lightning's, before on_validation_epoch_end) wait for every rank.
            self.source.finish_evaluation()

    @override
    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    # ------------------------------------------------------------------ checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        state = {"start_pass_at_k": self.start_pass_at_k, "group_size": self.settings.sampling.n}
        return self.source.state_dict() | state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.settings.check_resumed_group_size(state_dict.get("group_size"))
        self.start_pass_at_k = dict(state_dict.get("start_pass_at_k", {}))
        self.source.load_state_dict(state_dict)


def evaluation_loop(trainer: L.Trainer) -> Any:
    """The loop running the current validation or test batches (its ``batch_progress.is_last_batch`` is set before
    the batch's hooks run)."""
    if trainer.testing:
        return trainer.test_loop
    return trainer.fit_loop.epoch_loop.val_loop if trainer.state.fn == "fit" else trainer.validate_loop


def datamodule_of(trainer: L.Trainer) -> Any:
    """The trainer's data module, or None (Lightning sets ``trainer.datamodule`` without declaring it)."""
    return getattr(trainer, "datamodule", None)


__all__ = ["TEST_STREAM", "TRAIN_STREAM", "VAL_STREAM", "RolloutCallback", "RolloutConsumer", "RolloutSettings"]
