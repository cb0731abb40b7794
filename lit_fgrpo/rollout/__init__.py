"""Rollouts: the source and its schedules, the collector and the typed batches it produces.

The engine interface itself is :mod:`lit_fgrpo.engines.base`; ``SamplingConfig`` is re-exported here because it is
the rollout settings' ``sampling`` group (``--rollout.sampling.*``).
"""

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch, as_prompt_batch
from lit_fgrpo.rollout.collect import RolloutCollector, columns_per_completion, pad_id_of

__all__ = [
    "PromptBatch",
    "RolloutBatch",
    "RolloutCollector",
    "SamplingConfig",
    "as_prompt_batch",
    "columns_per_completion",
    "pad_id_of",
]
