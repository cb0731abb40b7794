"""What a rollout schedule implements (:class:`Schedule`) and what it receives: :class:`RolloutParts` once per engine,
:class:`StepContext` with each call.

A schedule (:mod:`~lit_fgrpo.rollout.sync_schedule`, :mod:`~lit_fgrpo.rollout.dynamic_schedule`,
:mod:`~lit_fgrpo.rollout.async_schedule`) decides when to sample and when to push. Everything it works with comes in
as arguments: the parts (settings, engine sync, collector), built once by
:class:`~lit_fgrpo.rollout.source.RolloutSource` and never changed, and the call's step, timer and logging function.
Nothing is stored between calls to tell a schedule which step it is at, and it never calls back into the source.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.objectives.group_weights import GroupWeight
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.collect import RolloutCollector
from lit_fgrpo.rollout.engine_sync import EngineSync
from lit_fgrpo.rollout.rollout_settings import RolloutSettings

LogFn = Callable[[dict[str, float], int], None]
"""``log(metrics, step)``: where the rollout side's event metrics go (a weight push, the held-out pass@k before RL);
the rollout callback passes its trainer's ``logger.log_metrics``."""


def no_log(metrics: dict[str, float], step: int) -> None:
    """A :data:`LogFn` that drops what it is given (no logger)."""


@dataclass(frozen=True)
class StepContext:
    """One call's arguments from the trainer: its step, and where its times and metrics go."""

    step: int
    """Optimizer steps done (Lightning's ``global_step``): seeds the batch, and the step its metrics are logged at."""
    world_size: int = 1
    """Ranks training together (dynamic sampling draws in lockstep across them)."""
    data: Any = None
    """The data module (dynamic sampling draws prompts from it; asynchronous rollouts read batches ahead)."""
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    """The step timer the schedule times sync, generate, reward and wait into (the module's: it logs them under
    ``time/``); a private one, never logged, by default."""
    log: LogFn = no_log
    """Where push metrics go, logged at :attr:`step`."""


@dataclass(frozen=True)
class RolloutParts:
    """What every call of a schedule works with: built once per engine by the source, never changed."""

    settings: RolloutSettings
    """The rollout settings (sampling, ``sync_every``)."""
    engine_sync: EngineSync
    """The engine, its weight pushes and their log-prob check."""
    collector: RolloutCollector
    """Sampling, decoding, reward scoring and packing of one batch; its ``last`` rollout is the next push's probe."""
    group_weight: GroupWeight
    """The module's per-group weight (dynamic sampling keeps the groups it weights)."""
    train_sampling: SamplingConfig
    """The training rollouts' sampling (``settings.train_sampling()``, fixed for the run)."""


class Schedule(Protocol):
    """One rollout mode: when to sample, from which prompts, and when to push weights."""

    def start(self, parts: RolloutParts, data: Any) -> None:
        """Refuse, before any work, a data module or engine this mode cannot use."""
        ...

    def take(self, parts: RolloutParts, batch: PromptBatch, call: StepContext) -> RolloutBatch:
        """The rollout to train on for Lightning's batch ``batch``; the schedule's own statistics of it are in its
        ``stats`` (logged by the module with the update's metrics)."""
        ...

    def after_step(self, parts: RolloutParts, call: StepContext) -> None:
        """After the optimizer steps of a training batch (``call.step`` = optimizer steps done): push as this mode
        says."""
        ...

    def paused(self) -> AbstractContextManager[Any]:
        """Exclusive use of the engine (evaluation while a generator thread runs)."""
        ...

    def close(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


__all__ = ["LogFn", "RolloutParts", "Schedule", "StepContext", "no_log"]
