"""The collectives the library makes: cross-rank reductions of logged statistics, failing together, and the
process-group handle of the training update.

Reductions: the same numbers on 1 rank or 16. A per-rank mean of a per-rank mean is not the global mean when ranks hold different counts (tokens, valid
rewards); reduce sums and counts, then divide. Without an initialised process group these are plain local values.

Failing together: a failure on one rank stops every rank, with the original message, instead of a hang.

A rank-local operation that raises (a weight-sync check, a reward function, a NaN loss) leaves the other ranks
waiting in their next collective until the process-group timeout (30 minutes by default). Wrap such an operation
in :func:`fail_together`: every rank then takes part in one small collective after it; if any rank failed, the
first failing rank's message is broadcast and every rank raises. The failing rank re-raises its own exception
(traceback intact); the others raise :class:`RankFailure` carrying that message.

Every rank must enter the same ``fail_together`` blocks in the same order (they are collectives).

The update's handle: :class:`~lit_fgrpo.training.update.PolicyUpdate` knows no process group; it makes every one of
its collectives (the token count's sum, the busiest rank's micro-batch count, the non-finite verdict, the logged
statistics' gather) through a :class:`Collectives`. :class:`TorchCollectives` uses the default process group (one
process when there is none); :class:`LightningCollectives` sums through a Trainer's strategy. Both take the max and
the gather from this module on the default group, the group of every Lightning strategy (a strategy has no object
gather).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:
    import lightning as L


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


class RankFailure(RuntimeError):
    """Raised on the ranks that did not fail themselves: another rank failed, with its message."""


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_device() -> torch.device:
    """NCCL only moves CUDA tensors; gloo (and the CPU) take CPU tensors."""
    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def describe(error: BaseException) -> str:
    """``TypeName: message``, the form in which an error travels to the other ranks."""
    return f"{type(error).__name__}: {error}"


def raise_if_any_rank_failed(error: BaseException | None, what: str) -> None:
    """A collective: raise on every rank if ``error`` is set on any rank.

    Args:
        error: This rank's exception, or ``None`` when its part succeeded.
        what: What was being done, for the message (e.g. ``"reward scoring at step 12"``).

    Raises:
        BaseException: ``error`` itself on a rank that failed.
        RankFailure: On the other ranks: ``"rank R failed in <what>: <Type>: <message>"``, from the lowest failing
            rank R.
    """
    if not is_distributed():
        if error is not None:
            raise error
        return
    world, rank = dist.get_world_size(), dist.get_rank()
    # MIN over (rank if failed else world): the lowest failing rank, or world when all succeeded.
    flag = torch.tensor([rank if error is not None else world], dtype=torch.int64, device=collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    source = int(flag.item())
    if source == world:
        return
    message = [describe(error) if rank == source and error is not None else None]
    dist.broadcast_object_list(message, src=source, device=collective_device())
    if error is not None:
        raise error
    raise RankFailure(f"rank {source} failed in {what}: {message[0]}")


@contextmanager
def fail_together(what: str) -> Iterator[None]:
    """Run the block; if it raises on any rank, raise on every rank (see :func:`raise_if_any_rank_failed`).

    Without an initialised process group (or with one rank) this is a plain block. ``KeyboardInterrupt`` and
    other ``BaseException`` s pass through untouched.

    Example:
        >>> with fail_together("reward scoring"):  # doctest: +SKIP
        ...     scored = score_completions(...)
    """
    error: Exception | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - every failure must reach the other ranks
        error = err
    raise_if_any_rank_failed(error, what)


def check_finite(value: torch.Tensor, what: str) -> None:
    """Stop every rank when ``value`` (e.g. the loss) is NaN or inf on any rank.

    Raises:
        FloatingPointError: On a rank where ``value`` is not finite.
        RankFailure: On the other ranks, with that message.
    """
    with fail_together(what):
        if not bool(torch.isfinite(value.detach()).all()):
            raise FloatingPointError(f"{what} is not finite: {value.detach().flatten()[:4].tolist()}")


@runtime_checkable
class Collectives(Protocol):
    """The cross-rank calls of the training update; every rank makes the same ones in the same order."""

    @property
    def world_size(self) -> int:
        """Number of ranks (1 in one process)."""
        ...

    def sum(self, value: Tensor) -> Tensor:
        """``value`` summed over ranks (an all-reduce)."""
        ...

    def max(self, value: int) -> int:
        """The largest ``value`` over ranks (an all-reduce)."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small and picklable), in rank order; ``[obj]`` in one process."""
        ...


class TorchCollectives:
    """:class:`Collectives` of the default ``torch.distributed`` process group (world 1 when none is set up)."""

    @property
    def world_size(self) -> int:
        initialized = dist.is_available() and dist.is_initialized()
        return dist.get_world_size() if initialized else 1

    def sum(self, value: Tensor) -> Tensor:
        return global_sum(value).to(value.dtype)

    max = staticmethod(global_max)
    gather = staticmethod(gather_objects)


class LightningCollectives:
    """:class:`Collectives` of a Trainer's strategy (DDP, FSDP, any launcher); world 1 without a Trainer.

    Args:
        trainer: the Trainer whose strategy sums; its world size is read once, here (it is set before any hook).
    """

    def __init__(self, trainer: L.Trainer | None) -> None:
        self.trainer = trainer
        self.world_size = trainer.world_size if trainer is not None else 1

    def sum(self, value: Tensor) -> Tensor:
        assert self.trainer is not None, "a sum over ranks needs the Trainer's strategy"
        # on the strategy's device: NCCL reduces CUDA tensors only
        summed = self.trainer.strategy.reduce(value.to(self.trainer.strategy.root_device), reduce_op="sum")
        return summed.to(value.device)

    max = staticmethod(global_max)
    gather = staticmethod(gather_objects)
