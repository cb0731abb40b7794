"""``PushGroups``: the trainer's side of ``push: collective``, one two-rank push group per server.

Forming a group with a server: the trainer hosts a ``TCPStore`` on a free port (on its address towards that server),
asks the server's worker to join as rank 1 (``/collective_rpc init_push_group``, in a thread: the HTTP call returns
only when the worker has joined) while it joins as rank 0 itself (another thread: a backend's constructor cannot be
interrupted), and waits for both at most ``push_timeout_s``. A group that does not form is one
:class:`~lit_fgrpo.servers.errors.ServerError` naming the server's URL, the store's address and port and what
failed, never a silent hang. A push: the layout goes as JSON through ``/collective_rpc receive_weights`` (thread)
while the trainer broadcasts the buckets (:mod:`~lit_fgrpo.engines.weight_wire`); a broadcast is polled, so a worker
that fails mid-push ends the push at once with its error. A group that failed is dropped, and the next push to that
server forms a new one (so does a restarted server, before it gets weights).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from lit_fgrpo.engines.weight_wire import Backend, Bucket, layout_json, open_group, pack, plan_buckets, start_broadcast
from lit_fgrpo.engines.weight_wire import finish as finish_work
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.servers.client import ServerClient
from lit_fgrpo.servers.errors import ServerError

JOIN_GRACE_S = 5.0
"""Slack over ``push_timeout_s`` for the HTTP answer of a call whose collective side has timed out already."""


def resolve_backend(choice: str, policy_device: torch.device) -> tuple[Backend, torch.device]:
    """The backend and the trainer's buffer device: ``auto`` = NCCL on a CUDA policy's device, else gloo (CPU).

    Raises:
        ConfigError: ``nccl`` for a policy that is not on a CUDA device.
    """
    if choice == "gloo" or (choice == "auto" and policy_device.type != "cuda"):
        return "gloo", torch.device("cpu")
    if policy_device.type != "cuda":
        raise ConfigError(
            f"engine_kwargs.push_backend 'nccl' needs the policy on a CUDA device, it is on {policy_device}"
        )
    return "nccl", policy_device


def local_address(url: str) -> str:
    """This machine's address on its route to the server at ``url`` (no packet is sent: a UDP socket's connect)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    family, kind, _, _, where = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as probe:
        probe.connect(where)
        return str(probe.getsockname()[0])


class _Call:
    """``fn()`` in a daemon thread; its result or exception once it ends (an abandoned one ends on its own)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # handed to the waiting thread, which raises it as a ServerError
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _wait(ready: Callable[[], bool], calls: list[_Call], deadline: float) -> BaseException | None:
    """Poll until ``ready()`` or any call failed or the deadline passed; the first failure (None when ready)."""
    while not ready():
        for call in calls:
            if call.done and call.error is not None:
                return call.error
        if time.monotonic() > deadline:
            return TimeoutError("no answer")
        time.sleep(0.001)
    return next((c.error for c in calls if c.error is not None), None)


class PushGroups:
    """The trainer's push groups, one per server URL, formed on first use.

    Args:
        timeout_s: longest wait for a group to form and for one push (``push_timeout_s``).
        push_host: the address servers dial for the trainer's store (None = :func:`local_address`).
        backend: ``gloo`` or ``nccl`` (see :func:`resolve_backend`).
        device: where the trainer's buffers live (the CPU for gloo).
    """

    def __init__(
        self, timeout_s: float, push_host: str | None = None, backend: Backend = "gloo", device: str = "cpu"
    ) -> None:
        self.timeout_s, self.push_host = timeout_s, push_host
        self.backend, self.device = backend, torch.device(device)
        self._groups: dict[str, Any] = {}
        self._staged: tuple[list[Bucket], list[torch.Tensor]] | None = None  # the last push: layout and buffers

    @property
    def staged(self) -> bool:
        """Whether a push is staged (what :meth:`send` sends, also to a restarted server)."""
        return self._staged is not None

    def stage(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy ``state_dict`` (any device, e.g. the live parameters) into the send buffers: this is the push
        :meth:`send` sends until the next ``stage``. The buffers (one per bucket, on :attr:`device`, in the tensors'
        own dtypes) are kept while the layout stays the same. Returns the tensors' bytes."""
        buckets = plan_buckets(state_dict)
        if self._staged is None or self._staged[0] != buckets:  # (use() drops it when the device changes)
            flats = [torch.empty(b.numel, dtype=b.torch_dtype, device=self.device) for b in buckets]  # (numel,)
            self._staged = (buckets, flats)
        for bucket, flat in zip(*self._staged):
            pack(bucket, state_dict, flat)
        return sum(t.numel() * t.element_size() for t in state_dict.values())

    def use(self, backend: Backend, device: torch.device) -> None:
        """Send with ``backend`` from ``device`` from now on (groups of another backend are dropped)."""
        if (backend, device) != (self.backend, self.device):
            self.close()
            self.backend, self.device = backend, device

    def form(self, client: ServerClient) -> Any:
        """A new group with the server behind ``client`` (an old one is dropped first).

        Raises:
            ServerError: it did not form within ``timeout_s``: one line with the URL, the store's address, the
                backend and the reason (the worker's error when it failed first).
        """
        self.drop(client.url)
        listen = local_address(client.url)
        store = dist.TCPStore(listen, 0, 2, True, timeout=timedelta(seconds=self.timeout_s), wait_for_workers=False)
        dial = self.push_host or listen
        own_host = urlsplit(client.url).hostname or listen
        args = (dial, str(store.port), self.backend, repr(self.timeout_s), own_host)
        remote = _Call(lambda: client.collective_rpc("init_push_group", *args, timeout_s=client.timeout_s))
        local = _Call(lambda: open_group(store, 0, self.backend, self.timeout_s, listen, self.device))
        error = _wait(lambda: remote.done and local.done, [remote, local], time.monotonic() + self.timeout_s + 1)
        if error is not None:
            raise ServerError(
                f"push group with vllm server {client.url} did not form ({self.backend}, trainer store "
                f"{dial}:{store.port}, timeout {self.timeout_s:g} s): {_line(error)}"
            )
        self._groups[client.url] = (local.result, store)
        return local.result

    def send(self, client: ServerClient) -> None:
        """Send the staged push (:meth:`stage`) to one server over its group (formed first when it has none).

        Raises:
            ServerError: the group did not form, or the push failed or outlasted ``timeout_s`` (the group is
                dropped: the next push forms a new one).
        """
        if self._staged is None:
            raise ValueError("PushGroups.send before stage: nothing to send")
        buckets, flats = self._staged
        group = self._groups[client.url][0] if client.url in self._groups else self.form(client)
        deadline = time.monotonic() + self.timeout_s
        remote = _Call(
            lambda: client.collective_rpc("receive_weights", layout_json(buckets), timeout_s=client.timeout_s)
        )
        error: BaseException | None = None
        for flat in flats:
            work = start_broadcast(group, flat)  # (bucket.numel,)
            error = _wait(work.is_completed, [remote], deadline)
            if error is None:
                try:
                    finish_work(work, self.device)
                except RuntimeError as exc:  # the group's own timeout, a peer that went away
                    error = exc
            if error is not None:
                break
        if error is None:
            error = _wait(lambda: remote.done, [remote], deadline + JOIN_GRACE_S)
        if error is not None:
            self.drop(client.url)
            raise ServerError(f"collective push to vllm server {client.url} failed ({self.backend}): {_line(error)}")

    def drop(self, url: str) -> None:
        """Forget the server's group (a failed or restarted server); the next push forms a new one."""
        self._groups.pop(url, None)

    def close(self) -> None:
        """Forget every group and the staged push."""
        self._groups.clear()
        self._staged = None
