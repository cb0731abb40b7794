"""``RolloutSource``: where training and evaluation rollouts come from, without a Trainer.

It owns the :class:`~lit_fgrpo.rollout.collect.RolloutCollector` (engine, rewards, packing), the engine's weight
pushes and their check (:class:`~lit_fgrpo.rollout.engine_sync.EngineSync`) and one schedule per mode:

- :class:`~lit_fgrpo.rollout.sync_schedule.SyncRollouts`: generate, then train (``max_staleness = 0``);
- :class:`~lit_fgrpo.rollout.dynamic_schedule.DynamicRollouts`: rounds drawn from the data until P groups are informative;
- :class:`~lit_fgrpo.rollout.async_schedule.AsyncRollouts`: a generator thread up to ``max_staleness`` steps ahead.

The schedule receives the parts (:class:`~lit_fgrpo.rollout.schedule.RolloutParts`, built once per engine) and, with
each call, the trainer's step, timer and logging function (:class:`~lit_fgrpo.rollout.schedule.StepContext`).
:class:`~lit_fgrpo.callbacks.RolloutCallback` is the Lightning glue: each hook turns the trainer's state into one
call here (``take``, ``after_step``, ``evaluation``, ``evaluate``, ``push_if_stale``, ``close``, ``state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from lit_fgrpo.data.data_settings import ENVIRONMENT_SOURCE
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.reporting.progress import progress
from lit_fgrpo.rewards import resolve_reward
from lit_fgrpo.rollout.async_schedule import AsyncRollouts
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.collect import RolloutCollector, pad_id_of
from lit_fgrpo.rollout.consumer import RolloutConsumer
from lit_fgrpo.rollout.dynamic_schedule import DynamicRollouts
from lit_fgrpo.rollout.engine_sync import EngineSync
from lit_fgrpo.rollout.episodes import FIRST_TURN, TOOL_USE, EpisodeRollouts, environment_reward
from lit_fgrpo.rollout.rollout_settings import ENVIRONMENT_REWARD, VAL_STREAM, RolloutSettings
from lit_fgrpo.rollout.schedule import LogFn, RolloutParts, Schedule, StepContext
from lit_fgrpo.rollout.sync_schedule import SyncRollouts


def schedule_for(settings: RolloutSettings) -> Schedule:
    """The rollout mode of ``settings``: asynchronous with ``max_staleness >= 1``, dynamic with ``dynamic_sampling``,
    else synchronous (the two are exclusive: :class:`RolloutSettings` refuses both at once)."""
    if settings.max_staleness > 0:
        return AsyncRollouts(settings.max_staleness)
    if settings.dynamic_sampling is not None:
        return DynamicRollouts(settings.dynamic_sampling)
    return SyncRollouts()


class RolloutSource:
    """Rollouts for training and evaluation, from settings; bind a consumer (the module) before sampling.

    Args:
        settings: the rollout settings (validated when built).
        schedule: the rollout mode; default from the settings (:func:`schedule_for`).
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
            decode_dtype=settings.decode_dtype,
            pack_weights=settings.pack_weights,
        )
        """The engine, its weight pushes and their check (built at the first use after :meth:`bind`)."""
        self._reward_funcs = [reward_function(name) for name in settings.reward_names]
        self._correctness = reward_function(settings.correctness) if settings.correctness else self._reward_funcs[0]
        self.consumer: RolloutConsumer | None = None
        self._parts: RolloutParts | None = None

    def bind(self, consumer: RolloutConsumer) -> None:
        """Sample from ``consumer.policy`` (read when the engine is built: after the module's ``configure_model``)."""
        if consumer is not self.consumer:
            self.close()  # an engine built from another module's policy
        self.consumer = consumer

    # ------------------------------------------------------------------ engine
    @property
    def engine(self) -> RolloutEngine | None:
        return self.engine_sync.engine

    @property
    def last_sync_step(self) -> int:
        """The global step of the last weight push (-1: none yet)."""
        return self.engine_sync.last_sync_step

    @property
    def asynchronous(self) -> AsyncRollouts | None:
        """The asynchronous schedule (its ``last`` batch handed over: index, version, staleness); None otherwise."""
        return self.schedule if isinstance(self.schedule, AsyncRollouts) else None

    def build(self) -> RolloutParts:
        """The engine, its collector and the schedule's parts, built once from the (now configured) policy."""
        if self._parts is None:
            assert self.consumer is not None, "RolloutSource.bind has not run"
            consumer, s = self.consumer, self.settings
            # episodes first: a chat template that cannot hold the environment's turns stops before the engine starts
            episodes = None
            if s.environments is not None:
                episodes = EpisodeRollouts.build(s, consumer.tokenizer, consumer.policy, self._reward_funcs)
            engine = self.engine_sync.build(consumer.policy, consumer.tokenizer)
            collector = RolloutCollector(
                engine,
                consumer.tokenizer,
                self._reward_funcs,
                s.weights,
                self._correctness,
                s.correct_threshold,
                pad_id_of(consumer.tokenizer),
                s.mask_truncated_completions,
                reward_timeout=s.reward_timeout,
                reward_isolation=s.reward_isolation,
                episodes=episodes,
            )
            self._parts = RolloutParts(s, self.engine_sync, collector, consumer.group_weight, s.train_sampling())
        return self._parts

    def push_if_stale(self, call: StepContext, prompt_ids: list[list[int]]) -> None:
        """Push now when the engine may hold other weights than the policy (a warm start, a restore); probed on the
        last rollout's rows, else on ``prompt_ids``; the metrics are logged at the call's step."""
        parts = self.build()
        metrics = parts.engine_sync.ensure_synced(call.step, parts.collector.last, prompt_ids)
        if metrics is not None:
            call.log(metrics, call.step)

    # ------------------------------------------------------------------ sampling
    def collect(self, records: Sequence[Any], sampling: SamplingConfig, step: int, stream: int) -> RolloutBatch:
        """Sample and score the groups of ``records`` (the collector keeps it as the next push's probe).

        ``step`` and ``stream`` seed each prompt (see :meth:`lit_fgrpo.rollout.collect.RolloutCollector.collect`).
        """
        return self.build().collector.collect(list(records), sampling, step=step, stream=stream)

    def take(self, batch: PromptBatch, call: StepContext) -> RolloutBatch:
        """The rollout to train on for Lightning's training batch (by this source's schedule)."""
        return self.schedule.take(self.build(), batch, call)

    def after_step(self, call: StepContext) -> None:
        """After a training batch's optimizer steps (``call.step``): push the weights as the schedule says."""
        self.schedule.after_step(self.build(), call)

    def evaluation(self, batch: PromptBatch, call: StepContext, stream: int, in_fit: bool) -> RolloutBatch:
        """A validation/test batch with the evaluation sampling, on weights that are the policy's (a push made for
        it is logged at the call's step)."""
        parts = self.build()
        with self.schedule.paused():
            metrics = parts.engine_sync.ensure_synced(call.step, parts.collector.last, batch.prompt_ids, in_fit)
            if metrics is not None:
                call.log(metrics, call.step)
            return self.collect(batch.records, self.settings.eval_sampling(), call.step, stream)

    def finish_evaluation(self) -> None:
        """This rank's evaluation pass is over. An engine the ranks share keeps serving the other ranks' remaining
        batches (a rank's share of the held-out prompts may be a batch shorter) until every rank's pass is over."""
        if self.engine is not None:
            with self.schedule.paused():
                self.engine.finish_rounds()

    @torch.no_grad()
    def evaluate(
        self,
        batches: Iterable[Sequence[Any]],
        ks: list[int],
        step: int,
        device: torch.device | str = "cpu",
        label: str = "pass@k before RL",
    ) -> dict[str, float]:
        """pass@k over ``batches`` of validation records with the evaluation sampling ({} with no prompt) and the
        half-width of each one's 95 % interval over the questions (``ci95_pass_at_<k>``); with an environment also
        ``correct_first_turn``, the share of episodes right at their first reply, and where it has tools ``tool_use``,
        the share of episodes with a valid tool call. ``label`` names the phase on the progress bar.

        ``device`` is the module's: the metric's states are reduced across ranks on the trainer's process group,
        and NCCL reduces CUDA tensors only.
        """
        from torchmetrics.aggregation import MeanMetric

        metric = PassAtK(list(ks)).to(device)
        environments = self.settings.environments
        # Every rank computes the same shares (each compute is a collective): decided by the settings, not the batches.
        names = [] if environments is None else [FIRST_TURN] + ([TOOL_USE] if environments.all_tools() else [])
        shares = {name: MeanMetric().to(device) for name in names}
        batches = list(batches)
        # minutes on a real validation set: a bar on a terminal, status lines in a log (lit_fgrpo.reporting.progress)
        with progress(label, total=len(batches), unit="batch") as bar:
            for records in batches:
                rollout = self.collect(list(records), self.settings.eval_sampling(), step, VAL_STREAM)
                metric.update(rollout.correct.to(device))
                for name, share in shares.items():
                    if name in rollout.stats:
                        share.update(rollout.stats[name], weight=rollout.correct.numel())
                bar.update(1)
        self.finish_evaluation()
        if float(metric.num_problems) == 0:
            return {}
        result = metric.compute()
        assert isinstance(result, dict)
        values = {name: float(value) for name, value in result.items()} | metric.half_width()
        return values | {name: float(share.compute()) for name, share in shares.items()}

    # ------------------------------------------------------------------ life cycle
    def start(self, data: Any) -> None:
        """A fit starts: the engine is built and marked stale (a warm start or a restore changes the policy after
        it), and the schedule checks the data module and the engine. Prompts that leave the engine no room to reply
        are refused first, before the engine starts."""
        if isinstance(data, PromptDataModule):
            if data.source == ENVIRONMENT_SOURCE and self.settings.environments is None:
                raise ConfigError(
                    f"--data.source {ENVIRONMENT_SOURCE} needs --rollout.environment: its rows hold no prompt, the "
                    "environment's reset() gives it"
                )
            self.settings.check_prompt_room(
                {split: max(len(r.prompt_ids) for r in records) for split, records in data.splits.items() if records}
            )
        parts = self.build()
        self.engine_sync.stale = True
        self.schedule.start(parts, data)

    def mark_stale(self) -> None:
        """The policy changed outside the schedule (a warm start): the next sample or evaluation pushes first."""
        self.engine_sync.stale = True

    def prepare(self, restored: bool) -> None:
        """An evaluation stage starts: the engine is built; ``restored``: a checkpoint was loaded after the build
        (``validate``/``test`` with ``ckpt_path``), so the next evaluation batch pushes first."""
        self.build()
        self.engine_sync.stale |= restored

    def stop(self) -> None:
        """Stop generating ahead (a generator thread must not outlive a failed run); the engine stays."""
        self.schedule.close()

    def close(self) -> None:
        """Stop generating, then shut the engine down (a later use builds a new one)."""
        self.schedule.close()
        if self._parts is not None:
            self._parts.collector.close()
        self.engine_sync.close()
        self._parts = None

    def state_dict(self) -> dict[str, Any]:
        return {"last_sync_step": self.engine_sync.last_sync_step} | self.schedule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine_sync.last_sync_step = int(state.get("last_sync_step", -1))
        self.engine_sync.stale = True  # the policy is being restored; the engine holds the weights it was built from
        self.schedule.load_state_dict(state)


def reward_function(name: str) -> Any:
    """A reward function by name: ``environment`` is the environment's ``get_reward()``, any other name or path goes
    through :func:`~lit_fgrpo.rewards.resolve_reward`."""
    return environment_reward if name == ENVIRONMENT_REWARD else resolve_reward(name)


def validation_batches(datamodule: Any) -> list[Any]:
    """The data module's validation batches (lists of records), or [] without any (read from ``val_dataloader()``
    directly: when a fit starts Lightning has not built its own loader yet)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if datamodule is None or not is_overridden("val_dataloader", datamodule):
        return []
    return list(datamodule.val_dataloader())


__all__ = ["LogFn", "RolloutSource", "Schedule", "StepContext", "schedule_for", "validation_batches"]
