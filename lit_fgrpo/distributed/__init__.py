"""Scale-out helpers: global batch shares, layout-independent seeds, failure propagation, full-weight gathering.

Lightning is the distributed engine (DDP, FSDP, ``num_nodes``, SLURM and torchrun launchers); these are the small
pieces the library needs to give the same result on any rank layout.
"""

from lit_fgrpo.distributed.collectives import (
    RankFailure,
    check_finite,
    fail_together,
    gather_objects,
    global_max,
    global_maxes,
    global_mean,
    global_nanmean,
    global_sum,
    raise_if_any_rank_failed,
)
from lit_fgrpo.distributed.rank_layout import per_rank_mini_batch, per_rank_share, prompt_seed
from lit_fgrpo.distributed.sharding import ShardingSettings, shard_policy
from lit_fgrpo.distributed.strategy import FSDP2Strategy  # registers --trainer.strategy model_parallel
from lit_fgrpo.distributed.weight_gather import full_tensor, is_sharded, iter_full_weights

__all__ = [
    "FSDP2Strategy",
    "ShardingSettings",
    "RankFailure",
    "check_finite",
    "fail_together",
    "full_tensor",
    "gather_objects",
    "global_max",
    "global_maxes",
    "global_mean",
    "global_nanmean",
    "global_sum",
    "is_sharded",
    "iter_full_weights",
    "per_rank_mini_batch",
    "per_rank_share",
    "prompt_seed",
    "raise_if_any_rank_failed",
    "shard_policy",
]
