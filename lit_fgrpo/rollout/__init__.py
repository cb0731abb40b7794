"""Rollouts: the engine interface, sampling settings, the collector and the typed batches it produces."""

from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig, pad_rollouts
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch, as_prompt_batch
from lit_fgrpo.rollout.collect import RolloutCollector, columns_per_completion, pad_id_of

__all__ = [
    "Generation",
    "PromptBatch",
    "RolloutBatch",
    "RolloutCollector",
    "RolloutEngine",
    "SamplingConfig",
    "as_prompt_batch",
    "columns_per_completion",
    "pad_id_of",
    "pad_rollouts",
]
