"""Failure on one rank stops every rank, with the original message, instead of a hang.

A rank-local operation that raises (a weight-sync check, a reward function, a NaN loss) leaves the other ranks
waiting in their next collective until the process-group timeout (30 minutes by default). Wrap such an operation
in :func:`fail_together`: every rank then takes part in one small collective after it; if any rank failed, the
first failing rank's message is broadcast and every rank raises. The failing rank re-raises its own exception
(traceback intact); the others raise :class:`RankFailure` carrying that message.

Every rank must enter the same ``fail_together`` blocks in the same order (they are collectives).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


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
