"""``Fleet``: the engine's servers, which of them are up, and bringing dead launched ones back.

A server is ``up`` (takes requests), ``starting`` (a launched server restarted after it died, not yet healthy) or
``dead``. A server given by URL that fails its health check is dead for the rest of the run (we cannot restart
it). A launched one is restarted at once, without blocking (the other servers keep generating), on the newest pushed
weights, at most ``restarts`` times; when it answers ``/health`` the fleet hands it to ``on_ready`` (the engine pushes
the current weights and checks them on the probe) before it takes requests again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from lit_fgrpo.servers.client import ServerClient
from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.process import ServerProcess, healthy

State = Literal["up", "starting", "dead"]


@dataclass
class Server:
    """One server of the fleet."""

    client: ServerClient
    """Its HTTP client."""
    process: ServerProcess | None = None
    """The process when we launched it (None for a server given by URL)."""
    state: State = "up"
    """Whether it takes requests."""
    restarts_left: int = 0
    """How often it may still be restarted."""
    started_at: float = field(default_factory=time.monotonic)
    """When its current process started (for the start-up timeout)."""
    last_failure: str = ""
    """Why it last went down (for the line that ends a run with no server left)."""

    @property
    def url(self) -> str:
        """Its base URL."""
        return self.client.url

    @property
    def where(self) -> str:
        """URL plus log file, for messages."""
        log = f" (log {self.process.spec.log_path})" if self.process is not None else ""
        return f"{self.url}{log}"


class Fleet:
    """The servers, their states and restarts.

    Args:
        servers: the fleet, all ``up``.
        startup_timeout_s: longest wait for a restarted server's ``/health``.
        on_ready: called with a restarted server once healthy, before it is ``up`` again (may raise ServerError).
    """

    def __init__(
        self, servers: list[Server], startup_timeout_s: float, on_ready: Callable[[Server], None] | None = None
    ) -> None:
        self.servers = servers
        self.startup_timeout_s = startup_timeout_s
        self.on_ready = on_ready
        self.model_dir: str | None = None
        """The newest full model directory (config, tokenizer, weights): what a restarted server serves."""

    def up(self) -> list[Server]:
        """Servers that take requests, after bringing in restarted ones that became healthy."""
        self.poll()
        return [s for s in self.servers if s.state == "up"]

    def any_starting(self) -> bool:
        """True while some restarted server may still come up."""
        return any(s.state == "starting" for s in self.servers)

    def failed(self, server: Server, reason: str) -> None:
        """A request to ``server`` failed: keep it when ``/health`` still answers, else restart or drop it."""
        if server.state != "up" or server.client.healthy():
            return
        print(f"vllm server {server.where} is down ({reason})", file=sys.stderr)
        server.last_failure = reason.replace(f"{server.url}/", "/")  # the line names the server once
        self._restart_or_drop(server)

    def _restart_or_drop(self, server: Server) -> None:
        if server.process is not None:
            server.process.stop(grace_s=0.0)
        if server.process is None or server.restarts_left <= 0:
            server.state = "dead"
            return
        server.restarts_left -= 1
        server.process = server.process.restarted(self.model_dir)
        server.process.start()
        server.state, server.started_at = "starting", time.monotonic()
        print(f"restarting vllm server {server.where} ({server.restarts_left} restarts left)", file=sys.stderr)

    def poll(self) -> None:
        """Move restarted servers on: healthy -> ``on_ready`` -> up; exited or too slow -> restart again or dead."""
        for server in self.servers:
            if server.state != "starting":
                continue
            assert server.process is not None
            if healthy(server.url):
                try:
                    if self.on_ready is not None:
                        self.on_ready(server)
                except ServerError as exc:
                    print(f"restarted vllm server {server.where} refused: {exc}", file=sys.stderr)
                    server.last_failure = f"refused after its restart: {exc}"
                    self._restart_or_drop(server)
                    continue
                server.state = "up"
            elif not server.process.alive() or time.monotonic() - server.started_at > self.startup_timeout_s:
                exited = not server.process.alive()
                server.last_failure = (
                    "exited while restarting"
                    if exited
                    else f"not healthy {self.startup_timeout_s:g} s after its restart"
                )
                self._restart_or_drop(server)

    def wait_for_any(self, what: str) -> list[Server]:
        """The up servers, waiting for restarted ones when none is up now.

        Raises:
            ServerError: no server is up and none is starting (one line naming each, why it went and its log file).
        """
        while True:
            servers = self.up()
            if servers:
                return servers
            if not self.any_starting():
                gone = "; ".join(f"{s.where}: {s.last_failure or 'stopped'}" for s in self.servers)
                raise ServerError(f"no vllm server left for {what}, all are dead: {gone}")
            time.sleep(0.5)

    def close(self) -> None:
        """Stop launched servers and close every client."""
        for server in self.servers:
            if server.process is not None:
                server.process.stop()
            server.client.close()
            server.state = "dead"
