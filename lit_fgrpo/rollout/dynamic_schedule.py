"""``DynamicRollouts``: DAPO's dynamic sampling, rounds drawn from the data module until P groups are informative.

The pure part (which groups to keep, when to stop, how ranks agree) is :func:`lit_fgrpo.rollout.group_filter.
dynamic_sample`; this schedule feeds it: prompts from the data module's cursor (:class:`PromptSource`), a seed per
round, and on several ranks the :class:`~lit_fgrpo.rollout.group_filter.Lockstep` collectives, each round
wrapped so that a failure on one rank stops every rank with its message. The loader's own batch only paces the
step; its records are not trained on. Pushes are the synchronous schedule's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from lit_fgrpo.distributed import fail_together
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.group_weights import GroupWeight
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.group_filter import DynamicSampling, Lockstep, dynamic_sample, ranks_round_need
from lit_fgrpo.rollout.rollout_settings import TRAIN_STREAM
from lit_fgrpo.rollout.schedule import RolloutParts, StepContext
from lit_fgrpo.rollout.sync_schedule import SyncRollouts

DYNAMIC_ROUND_SEED_OFFSET = 3_000_017
"""Dynamic-sampling round r of training step s seeds its prompts with step ``s + r * DYNAMIC_ROUND_SEED_OFFSET``."""

CollectFn = Callable[[list[Any], int], RolloutBatch]
"""``collect(records, seed_step)``: sample and score the groups of these prompts with the training sampling."""


@runtime_checkable
class PromptSource(Protocol):
    """A data module that hands out the next training prompts one by one (dynamic sampling draws through it).

    :class:`~lit_fgrpo.data.PromptDataModule` is one: :meth:`~lit_fgrpo.data.PromptDataModule.draw_prompts`.
    """

    def draw_prompts(self, count: int) -> list[Any]: ...


def prompt_source(datamodule: Any) -> PromptSource:
    """The data module as a :class:`PromptSource`; refused in one line naming the setting otherwise.

    Raises:
        ConfigError: The data module has no ``draw_prompts(count)``.
    """
    if not isinstance(datamodule, PromptSource):
        raise ConfigError(
            "RolloutCallback.dynamic_sampling needs a data module with draw_prompts(count) (PromptDataModule); "
            f"got {type(datamodule).__name__}"
        )
    return datamodule


def dynamic_rollout(
    collect: CollectFn,
    source: PromptSource,
    num_prompts: int,
    config: DynamicSampling,
    group_weight: GroupWeight | None,
    pad_token_id: int,
    step: int,
    world_size: int,
    join: Callable[[], None] = lambda: None,
) -> RolloutBatch:
    """This rank's ``num_prompts`` informative groups of training step ``step``, drawn in rounds from ``source``.

    Several ranks (``world_size`` > 1) draw in lockstep; a round that raises on one rank (a reward crash), or a rank
    left short with ``on_short="error"``, stops every rank with its message. ``join()`` takes part in the engine's
    round where this rank skips (an engine shared by the ranks, whose ``generate`` is a collective).
    """
    rounds = 0
    what = f"the dynamic-sampling rollout at step {step}"

    def draw(count: int) -> RolloutBatch:
        nonlocal rounds
        # drawn prompts carry their own stream positions; the round offset keeps seeds apart regardless
        seed_step = step + rounds * DYNAMIC_ROUND_SEED_OFFSET
        rounds += 1
        with fail_together(what):
            return collect(source.draw_prompts(count), seed_step)

    def skip(count: int) -> int:  # only once this rank has its groups: no draw (and no round seed) follows
        join()  # the engine round the generating ranks' draw takes part in (a shared engine's collective)
        with fail_together(what):  # the collective the generating ranks' draw takes part in
            return len(source.draw_prompts(count))

    lockstep = Lockstep(ranks_round_need, skip) if world_size > 1 else None
    with fail_together(what):
        rollout, _ = dynamic_sample(draw, num_prompts, config, group_weight, pad_token_id, lockstep)
    return rollout


class DynamicRollouts(SyncRollouts):
    """The dynamic-sampling schedule (``RolloutCallback.dynamic_sampling``).

    Args:
        config: the dynamic-sampling settings.
    """

    def __init__(self, config: DynamicSampling) -> None:
        self.config = config

    def start(self, parts: RolloutParts, data: Any) -> None:
        prompt_source(data)  # refuse a data module without draw_prompts before any work

    def sample(self, parts: RolloutParts, batch: PromptBatch, call: StepContext) -> RolloutBatch:
        """P informative groups drawn in rounds from the data module (the loader's batch only paces the step)."""
        sampling, collector = parts.train_sampling, parts.collector

        def collect(records: list[Any], seed_step: int) -> RolloutBatch:
            return collector.collect(list(records), sampling, step=seed_step, stream=TRAIN_STREAM)

        return dynamic_rollout(
            collect,
            prompt_source(call.data),
            len(batch.records),
            self.config,
            parts.group_weight,
            collector.pad_token_id,
            call.step,
            call.world_size,
            join=lambda: collector.join_round(sampling),
        )


__all__ = ["DYNAMIC_ROUND_SEED_OFFSET", "DynamicRollouts", "PromptSource", "dynamic_rollout", "prompt_source"]
