"""Spread one step's requests over the fleet, retry failures on another server, return results in request order.

Each request is one prompt with its own seed, so which server answers it does not change its samples: a request
retried elsewhere (after a failure, a timeout, or its server's death) gives the rollout a healthy run would have
produced. Requests go to the least-loaded up server, at most ``max_inflight`` at a time per server, and a retry
prefers a server the request has not failed on yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.fleet import Fleet, Server

T = TypeVar("T")
Json = dict[str, Any]


def pick_server(servers: Sequence[Server], load: dict[str, int], tried: set[str], max_inflight: int) -> Server | None:
    """The least-loaded server with a free slot, preferring those not in ``tried`` (None when all are full)."""
    free = [s for s in servers if load.get(s.url, 0) < max_inflight]
    fresh = [s for s in free if s.url not in tried] or free
    return min(fresh, key=lambda s: load.get(s.url, 0)) if fresh else None


def run_requests(
    fleet: Fleet,
    path: str,
    bodies: Sequence[Json],
    parse: Callable[[Json], T],
    *,
    max_attempts: int,
    max_inflight: int,
    what: str,
) -> list[T]:
    """POST every body to ``path`` on some up server; ``parse`` of each answer, in the order of ``bodies``.

    Args:
        fleet: the servers.
        path: the route (``/v1/completions``).
        bodies: one JSON body per request.
        parse: turns an answer into a result; a ValueError / KeyError counts as a failed request.
        max_attempts: tries per request, over all servers.
        max_inflight: concurrent requests per server.
        what: names the work in errors (e.g. ``"the rollout"``).

    Raises:
        ServerError: a request failed ``max_attempts`` times, or no server is left (one line, naming the server).
    """
    results: list[Any] = [None] * len(bodies)
    attempts = [0] * len(bodies)
    tried: list[set[str]] = [set() for _ in bodies]
    pending = deque(range(len(bodies)))
    load: dict[str, int] = {}
    inflight: dict[Future[Any], tuple[int, Server]] = {}
    executor = ThreadPoolExecutor(max_workers=max(1, max_inflight * len(fleet.servers)))
    try:
        while pending or inflight:
            if pending:
                servers = fleet.up() if inflight else fleet.wait_for_any(what)
                while pending and (server := pick_server(servers, load, tried[pending[0]], max_inflight)):
                    index = pending.popleft()
                    load[server.url] = load.get(server.url, 0) + 1
                    inflight[executor.submit(server.client.post, path, dict(bodies[index]))] = (index, server)
            done, _ = wait(list(inflight), timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                index, server = inflight.pop(future)
                load[server.url] -= 1
                try:
                    results[index] = parse(future.result())
                except (ServerError, ValueError, KeyError, TypeError) as exc:
                    attempts[index] += 1
                    tried[index].add(server.url)
                    if attempts[index] >= max_attempts:
                        raise ServerError(
                            f"{what}: request {index} failed {attempts[index]} times (max_attempts), "
                            f"last on {server.where}: {exc}"
                        ) from exc
                    fleet.failed(server, str(exc))
                    pending.appendleft(index)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    return results
