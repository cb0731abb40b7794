"""What a rollout schedule works with, handed down by :class:`~lit_fgrpo.rollout.source.RolloutSource`.

A schedule (:mod:`~lit_fgrpo.rollout.sync_schedule`, :mod:`~lit_fgrpo.rollout.dynamic_schedule`,
:mod:`~lit_fgrpo.rollout.async_schedule`) decides when to sample and when to push; it receives the collector, the
engine sync, the settings and the step timer in one :class:`RolloutParts` and never calls back into the source that
owns them, so the dependency runs one way: source -> schedule -> parts.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.collect import RolloutCollector
from lit_fgrpo.rollout.consumer import RolloutConsumer
from lit_fgrpo.rollout.engine_sync import EngineSync
from lit_fgrpo.rollout.rollout_settings import RolloutSettings


@dataclass(frozen=True)
class StepContext:
    """The trainer's state a schedule needs for one training batch."""

    step: int
    """Optimizer steps done (Lightning's ``global_step``): seeds the batch and names it in messages."""
    world_size: int
    """Ranks training together (dynamic sampling draws in lockstep across them)."""
    data: Any
    """The data module (dynamic sampling draws prompts from it; asynchronous rollouts read batches ahead)."""


@dataclass
class RolloutParts:
    """The source's parts, built once per engine: one object shared by the source and its schedule."""

    settings: RolloutSettings
    """The rollout settings (sampling, ``sync_every``)."""
    engine_sync: EngineSync
    """The engine, its weight pushes and their log-prob check."""
    collector: RolloutCollector
    """Sampling, decoding, reward scoring and packing of one batch."""
    consumer: RolloutConsumer
    """The module's side: policy, tokenizer, group weight."""
    timer: PhaseTimer
    """The consumer's step timer."""
    train_sampling: SamplingConfig
    """The training rollouts' sampling (``settings.train_sampling()``, fixed for the run: read once)."""
    step: int = 0
    """The optimizer step of the call in progress (a push made from a generator thread logs at it)."""


class Schedule(Protocol):
    """One rollout mode: when to sample, from which prompts, and when to push weights."""

    def start(self, parts: RolloutParts, data: Any) -> None:
        """Refuse, before any work, a data module or engine this mode cannot use."""
        ...

    def take(self, parts: RolloutParts, batch: PromptBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        """The rollout to train on for Lightning's batch ``batch``, and metrics for the module to log."""
        ...

    def after_step(self, parts: RolloutParts, step: int) -> None:
        """After the optimizer steps of a training batch (``step`` = optimizer steps done): push as this mode says."""
        ...

    def paused(self) -> AbstractContextManager[Any]:
        """Exclusive use of the engine (evaluation while a generator thread runs)."""
        ...

    def close(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


__all__ = ["RolloutParts", "Schedule", "StepContext"]
