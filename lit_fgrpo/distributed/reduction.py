"""Cross-rank sums and means of logged statistics (rewards, token counts): the same numbers on 1 rank or 16.

A per-rank mean of a per-rank mean is not the global mean when ranks hold different counts (tokens, valid
rewards); reduce sums and counts, then divide. Without an initialised process group these are plain local values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lit_fgrpo.distributed.failures import collective_device, is_distributed


def global_sum(value: Tensor) -> Tensor:
    """Sum of ``value`` over ranks (elementwise), in float64 for exact integer counts up to 2**53."""
    local = value.detach().to(torch.float64)
    if not is_distributed():
        return local
    out = local.to(collective_device()).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(value.device)


def global_mean(total: Tensor, count: Tensor) -> Tensor:
    """``sum_r total_r / sum_r count_r``: the mean over every item on every rank (NaN when there are none).

    Args:
        total: This rank's sum of the values (e.g. ``rewards.nansum()``).
        count: This rank's number of values (e.g. ``(~rewards.isnan()).sum()``).
    """
    both = global_sum(torch.stack([total.detach().reshape(()).double(), count.detach().reshape(()).double()]))
    return both[0] / both[1] if float(both[1]) > 0 else torch.full((), float("nan"), dtype=torch.float64)


def global_nanmean(values: Tensor) -> Tensor:
    """Mean of the non-NaN entries of ``values`` over all ranks (e.g. the rollout rewards)."""
    valid = ~torch.isnan(values)
    return global_mean(torch.where(valid, values, torch.zeros_like(values)).sum(), valid.sum())


def global_max(value: int) -> int:
    """The largest ``value`` over ranks (e.g. the number of micro-batches every rank must run)."""
    return global_maxes(value)[0]


def global_maxes(*values: int) -> tuple[int, ...]:
    """The largest of each of ``values`` over ranks, in one all-reduce (e.g. groups missing and a done flag)."""
    if not is_distributed():
        return tuple(int(v) for v in values)
    out = torch.tensor([int(v) for v in values], dtype=torch.int64, device=collective_device())
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return tuple(int(v) for v in out.tolist())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable, e.g. small CPU tensors of logged statistics), in rank order; ``[obj]`` alone.

    For statistics whose exact global value needs the items themselves (a median, a std, per-group rates) rather
    than a sum and a count; keep ``obj`` small.
    """
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
