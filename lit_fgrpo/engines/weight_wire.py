"""What both ends of a collective weight push share: the two-rank group and the layout of the weights on the wire.

The group is a bare torch backend (``ProcessGroupGloo`` or ``ProcessGroupNCCL``) built on a ``TCPStore`` the trainer
hosts, never ``torch.distributed.init_process_group``: the server's worker already has vLLM's world group and the
trainer may have its DDP/FSDP one, and neither may see this group. Its world is 2 (trainer rank 0, one server's
worker rank 1), so a dead server takes only its own group down.

The weights travel as **buckets**: one flat 1-D buffer per bucket, all tensors of one dtype, at most
:data:`BUCKET_BYTES` each (one tensor larger than that gets a bucket of its own), so a push is a few broadcasts and
neither side holds a second copy of the whole model at once. The layout (names, shapes, dtypes) goes as JSON over
``/collective_rpc``, which passes strings only. This module imports torch only (the worker imports it too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

Backend = Literal["gloo", "nccl"]
BUCKET_BYTES = 256 * 1024 * 1024
"""Largest bucket (bytes): bounds the extra memory of a push on either side."""


@dataclass(frozen=True)
class Bucket:
    """One flat buffer on the wire: tensors of one dtype, back to back."""

    dtype: str
    """``torch.float32`` etc., as ``str(dtype)`` spells it."""
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    """(checkpoint name, shape) of each tensor, in buffer order."""

    @property
    def numel(self) -> int:
        """Elements of the flat buffer."""
        return sum(_numel(shape) for _, shape in self.tensors)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as a torch object."""
        dtype = getattr(torch, self.dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {self.dtype!r} in a weight-push layout")
        return dtype


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def plan_buckets(state_dict: dict[str, torch.Tensor], max_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    """Group the tensors by dtype (first-seen order) into buckets of at most ``max_bytes``."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in state_dict.items():
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets = []
    for dtype, items in by_dtype.items():
        current: list[tuple[str, tuple[int, ...]]] = []
        size = 0
        for name, tensor in items:
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > max_bytes:
                buckets.append(Bucket(str(dtype), tuple(current)))
                current, size = [], 0
            current.append((name, tuple(tensor.shape)))
            size += nbytes
        buckets.append(Bucket(str(dtype), tuple(current)))
    return buckets


def layout_json(buckets: list[Bucket]) -> str:
    """The layout as the JSON string ``/collective_rpc`` carries."""
    return json.dumps([{"dtype": b.dtype, "tensors": [[n, list(s)] for n, s in b.tensors]} for b in buckets])


def parse_layout(text: str) -> list[Bucket]:
    """The inverse of :func:`layout_json`."""
    return [
        Bucket(b["dtype"], tuple((str(n), tuple(int(x) for x in s)) for n, s in b["tensors"])) for b in json.loads(text)
    ]


def pack(bucket: Bucket, state_dict: dict[str, torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the bucket's tensors (any device) into ``flat``, a ``(bucket.numel,)`` buffer of the bucket's dtype.

    Into a buffer the caller keeps between pushes: a fresh CPU buffer of tens of MB costs more in page faults than
    the copy (100-350 ms against 2-20 ms for 34 MB on the loaded 2-core box)."""
    with torch.no_grad():
        for name, view in unpack(bucket, flat):
            view.copy_(state_dict[name])  # shape: the tensor's own


def unpack(bucket: Bucket, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into a received buffer, in bucket order."""
    offset = 0
    for name, shape in bucket.tensors:
        count = _numel(shape)
        yield name, flat[offset : offset + count].view(shape)  # shape
        offset += count


def open_group(
    store: dist.Store, rank: int, backend: Backend, timeout_s: float, hostname: str, device: torch.device
) -> Any:
    """A 2-rank backend on ``store``, connected before it returns (a warm-up broadcast on ``device``): NCCL connects
    lazily otherwise, and a group that does not form must fail here, within ``timeout_s``.

    Args:
        store: the trainer's ``TCPStore`` (a client of it on the server).
        rank: 0 on the trainer, 1 on the server's worker.
        backend: ``gloo`` (tensors on the CPU) or ``nccl`` (tensors on ``device``, a CUDA device).
        timeout_s: longest wait for the peer, here and in every later broadcast.
        hostname: the address this rank's gloo device binds to (one the other rank can reach).
        device: where this rank's buffers live.

    Returns:
        The torch backend object (typed ``Any``: torch's stubs declare no collectives on ``Backend``).

    Raises:
        RuntimeError: the peer did not join within ``timeout_s`` (torch's ``DistStoreError`` among others).
    """
    timeout = timedelta(seconds=timeout_s)
    group: Any
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the stubs omit it
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
        group = dist.ProcessGroupGloo(store, rank, 2, options)
    else:
        nccl: Any = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("push_backend 'nccl' needs a torch built with NCCL (this one is not)")
        options = nccl.Options()
        options._timeout = timeout
        torch.cuda.set_device(device)
        group = nccl(store, rank, 2, options)
    finish(start_broadcast(group, torch.zeros(1, device=device)), device)  # (1,): no peer fails here
    return group


def start_broadcast(group: Any, tensor: torch.Tensor) -> Any:
    """Start broadcasting ``tensor`` from rank 0 in place; the torch ``Work`` (poll ``is_completed()``)."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([tensor], options)


def finish(work: Any, device: torch.device) -> None:
    """Wait for a broadcast on the host (bounded by the group's timeout): NCCL's ``wait`` only orders streams."""
    work.wait()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
