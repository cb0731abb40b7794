"""The rollout schedules by mode, chosen from the settings in one place."""

from __future__ import annotations

from lit_fgrpo.rollout.async_schedule import AsyncRollouts
from lit_fgrpo.rollout.dynamic_schedule import DynamicRollouts
from lit_fgrpo.rollout.parts import Schedule
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.rollout.sync_schedule import SyncRollouts


def schedule_for(settings: RolloutSettings) -> Schedule:
    """Asynchronous with ``max_staleness >= 1``, dynamic with ``dynamic_sampling``, else synchronous (the two
    are exclusive: :class:`RolloutSettings` refuses both at once)."""
    if settings.max_staleness > 0:
        return AsyncRollouts(settings.max_staleness)
    if settings.dynamic_sampling is not None:
        return DynamicRollouts(settings.dynamic_sampling)
    return SyncRollouts()


__all__ = ["schedule_for"]
