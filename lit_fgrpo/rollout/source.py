"""``RolloutSource``: where training and evaluation rollouts come from, without a Trainer.

It owns the :class:`~lit_fgrpo.rollout.collect.RolloutCollector` (engine, rewards, packing), the engine's weight
pushes and their check (:class:`~lit_fgrpo.rollout.engine_sync.EngineSync`) and one schedule per mode:

- :class:`~lit_fgrpo.rollout.sync_schedule.SyncRollouts`: generate, then train (``max_staleness = 0``);
- :class:`~lit_fgrpo.rollout.dynamic_schedule.DynamicRollouts`: rounds drawn from the data until P groups are informative;
- :class:`~lit_fgrpo.rollout.async_schedule.AsyncRollouts`: a generator thread up to ``max_staleness`` steps ahead.

:class:`~lit_fgrpo.callbacks.RolloutCallback` is the Lightning glue: each hook turns the trainer's state into one
call here (``take``, ``after_step``, ``evaluation``, ``evaluate``, ``close``, ``state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.reporting.progress import progress
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rewards import resolve_reward
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.collect import RolloutCollector, pad_id_of
from lit_fgrpo.rollout.consumer import RolloutConsumer
from lit_fgrpo.rollout.engine_sync import EngineSync, LogFn
from lit_fgrpo.rollout.parts import RolloutParts, Schedule, StepContext
from lit_fgrpo.rollout.rollout_settings import VAL_STREAM, RolloutSettings
from lit_fgrpo.rollout.schedules import schedule_for


class RolloutSource:
    """Rollouts for training and evaluation, from settings; bind a consumer (the module) before sampling.

    Args:
        settings: the rollout settings (validated when built).
        schedule: the rollout mode; default from the settings (:func:`~lit_fgrpo.rollout.schedules.schedule_for`).
    """

    def __init__(self, settings: RolloutSettings, schedule: Schedule | None = None) -> None:
        self.settings = settings
        self.schedule: Schedule = schedule if schedule is not None else schedule_for(settings)
        self.engine_sync = EngineSync(
            settings.engine,
            settings.engine_kwargs or {},
            settings.hf_chunk_size,
            settings.sync_tolerance,
            settings.sync_probe_rows,
        )
        """The engine, its weight pushes and their check (built at the first use after :meth:`bind`)."""
        self._reward_funcs = [resolve_reward(name) for name in settings.reward_names]
        self._correctness = resolve_reward(settings.correctness) if settings.correctness else self._reward_funcs[0]
        self.collector: RolloutCollector | None = None
        self._parts: RolloutParts | None = None
        self.consumer: RolloutConsumer | None = None
        self.timer = PhaseTimer()
        """The consumer's step timer once bound (a private one, never logged, before)."""
        self.log: LogFn = lambda metrics, step: None
        self.step = 0
        """The optimizer step of the call in progress (pushes made from a generator's schedule log at it)."""

    def bind(self, consumer: RolloutConsumer, log: LogFn | None = None) -> None:
        """Sample from ``consumer.policy``, time into ``consumer.timer``, log push metrics through ``log``."""
        self.consumer, self.timer = consumer, consumer.timer
        if log is not None:
            self.log = log
        self.engine_sync.bind(consumer, self.log)

    # ------------------------------------------------------------------ engine
    @property
    def engine(self) -> RolloutEngine | None:
        return self.engine_sync.engine

    def build(self) -> RolloutCollector:
        """The engine and its collector, built once from the (now configured) policy."""
        assert self.consumer is not None, "RolloutSource.bind has not run"
        engine = self.engine_sync.build(self.consumer.policy, self.consumer.tokenizer)
        if self.collector is None:
            tokenizer, s = self.consumer.tokenizer, self.settings
            self.collector = RolloutCollector(
                engine,
                tokenizer,
                self._reward_funcs,
                s.reward_weights,
                self._correctness,
                s.correct_threshold,
                pad_id_of(tokenizer),
                s.mask_truncated_completions,
                reward_timeout=s.reward_timeout,
                reward_isolation=s.reward_isolation,
            )
            self.engine_sync.collector = self.collector  # its last rollout is the next push's probe
        return self.collector

    def parts(self) -> RolloutParts:
        """The parts handed to the schedule (built with the engine; the step and timer of the call in progress)."""
        collector = self.build()
        assert self.consumer is not None
        if self._parts is None or self._parts.collector is not collector:
            self._parts = RolloutParts(
                self.settings, self.engine_sync, collector, self.consumer, self.timer, self.settings.train_sampling()
            )
        self._parts.timer, self._parts.consumer, self._parts.step = self.timer, self.consumer, self.step
        return self._parts

    def push(self, step: int) -> None:
        """Push the policy's weights into the engine and check them; the metrics are logged at ``step``."""
        self.build()
        self.engine_sync.sync(step)

    def ensure_synced(self, step: int, prompt_ids: list[list[int]], evaluation_in_fit: bool = False) -> None:
        """Push before sampling when the engine may be behind the policy (stale, or for an evaluation during fit,
        optimizer steps since the last push); ``prompt_ids`` give a probe when no rollout has yet."""
        self.build()
        self.engine_sync.ensure_synced(step, prompt_ids, evaluation_in_fit)

    # ------------------------------------------------------------------ sampling
    def collect(self, records: Sequence[Any], sampling: SamplingConfig, step: int, stream: int) -> RolloutBatch:
        """Sample and score the groups of ``records`` (the collector keeps it as the next push's probe).

        ``step`` and ``stream`` seed each prompt (see :meth:`lit_fgrpo.rollout.collect.RolloutCollector.collect`).
        """
        return self.build().collect(list(records), sampling, step=step, stream=stream)

    def take(self, batch: PromptBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        """The rollout to train on for Lightning's training batch (by this source's schedule)."""
        self.step = ctx.step
        return self.schedule.take(self.parts(), batch, ctx)

    def after_step(self, step: int) -> None:
        """After a training batch's optimizer steps: push the weights as the schedule says."""
        self.step = step
        self.schedule.after_step(self.parts(), step)

    def evaluation(self, batch: PromptBatch, step: int, stream: int, in_fit: bool) -> RolloutBatch:
        """A validation/test batch with the evaluation sampling, on weights that are the policy's."""
        self.step = step
        if self._parts is not None:
            self._parts.step = step  # a push made while evaluating logs at this step
        with self.schedule.paused():
            self.ensure_synced(step, batch.prompt_ids, evaluation_in_fit=in_fit)
            return self.collect(batch.records, self.settings.eval_sampling(), step, stream)

    def finish_evaluation(self) -> None:
        """This rank's evaluation pass is over. An engine the ranks share keeps serving the other ranks' remaining
        batches (a rank's share of the held-out prompts may be a batch shorter) until every rank's pass is over."""
        if self.engine is not None:
            with self.schedule.paused():
                self.engine.finish_rounds()

    @torch.no_grad()
    def evaluate(
        self, batches: Iterable[Sequence[Any]], ks: list[int], step: int, device: torch.device | str = "cpu"
    ) -> dict[str, float]:
        """pass@k over ``batches`` of validation records with the evaluation sampling ({} with no prompt).

        ``device`` is the module's: the metric's states are reduced across ranks on the trainer's process group,
        and NCCL reduces CUDA tensors only.
        """
        metric = PassAtK(list(ks)).to(device)
        batches = list(batches)
        # minutes on a real validation set: a bar on a terminal, status lines in a log (lit_fgrpo.reporting.progress)
        with progress("pass@k before RL", total=len(batches), unit="batch") as bar:
            for records in batches:
                rollout = self.collect(list(records), self.settings.eval_sampling(), step, VAL_STREAM)
                metric.update(rollout.correct.to(device))
                bar.update(1)
        self.finish_evaluation()
        if float(metric.num_problems) == 0:
            return {}
        result = metric.compute()
        assert isinstance(result, dict)
        return {name: float(value) for name, value in result.items()}

    # ------------------------------------------------------------------ life cycle
    def start(self, data: Any) -> None:
        """A fit starts: the engine is built and marked stale (a warm start or a restore changes the policy after
        it), and the schedule checks the data module and the engine."""
        parts = self.parts()
        self.engine_sync.stale = True
        self.schedule.start(parts, data)

    def close(self) -> None:
        """Stop generating, then shut the engine down (a later use builds a new one)."""
        self.schedule.close()
        self.engine_sync.close()
        self.collector = self._parts = None

    def state_dict(self) -> dict[str, Any]:
        return {"last_sync_step": self.engine_sync.last_sync_step} | self.schedule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine_sync.last_sync_step = int(state.get("last_sync_step", -1))
        self.engine_sync.stale = True  # the policy is being restored; the engine holds the weights it was built from
        self.schedule.load_state_dict(state)


def validation_batches(datamodule: Any) -> list[Any]:
    """The data module's validation batches (lists of records), or [] without any (read from ``val_dataloader()``
    directly: when a fit starts Lightning has not built its own loader yet)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if datamodule is None or not is_overridden("val_dataloader", datamodule):
        return []
    return list(datamodule.val_dataloader())


__all__ = ["LogFn", "RolloutSource", "Schedule", "StepContext", "validation_batches"]
