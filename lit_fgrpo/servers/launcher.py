"""Getting servers: the ``vllm serve`` command lines for ``launch: N`` and starting them, or connecting to ``urls``.

What a launch needs from this machine is checked before any server starts (:func:`check_launch_here`): a server
pinned to a core this process may not use would otherwise end in the server's own "OSError: [Errno 22] Invalid
argument" seconds later, a host that is not this machine's or a port in use in a bind error in its log.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from lit_fgrpo.engines.vllm_worker import WORKER_EXTENSION
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.servers.adapters import LORA_ENV, lora_serve_args
from lit_fgrpo.servers.client import ServerClient
from lit_fgrpo.servers.errors import ServerError
from lit_fgrpo.servers.fleet import Fleet, Server
from lit_fgrpo.servers.process import LaunchSpec, free_port, launch_all
from lit_fgrpo.servers.server_settings import CPU_SERVE_ARGS, FLAG, ServerSettings


def check_launch_here(settings: ServerSettings, ports: bool = True) -> None:
    """Refuse launch settings this machine cannot run, in one line naming the option and the value: a core outside
    this process's affinity (``os.sched_getaffinity``), a ``host`` this machine cannot bind, and (with ``ports``) a
    port already in use there. Nothing to check for servers given by URL.

    Raises:
        ConfigError: one line naming ``--rollout.engine_kwargs.<key>``.
    """
    if not settings.launch:
        return
    if settings.cores and hasattr(os, "sched_getaffinity"):
        usable = sorted(os.sched_getaffinity(0))
        for i, cores in enumerate(settings.cores):
            missing = sorted(set(cores) - set(usable))
            if missing:
                raise ConfigError(
                    f"{FLAG}.cores[{i}] names core(s) {missing} that this process cannot use; it may run on "
                    f"{_core_ranges(usable)}"
                )
    try:
        free_port(settings.host)
    except OSError as exc:  # socket.gaierror included: a name that does not resolve
        raise ConfigError(f"{FLAG}.host {settings.host!r} cannot be bound on this machine ({exc.strerror})") from None
    for i, port in enumerate(settings.ports if ports else ()):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
            try:
                sock.bind((settings.host, port))
            except OSError as exc:
                raise ConfigError(f"{FLAG}.ports[{i}] {port} on {settings.host}: {exc.strerror}") from None


def _core_ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"cores 0-2, 5"``."""
    spans: list[list[int]] = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return "cores " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def serve_args(settings: ServerSettings, lora_rank: int = 0) -> tuple[str, ...]:
    """``vllm serve`` arguments after model, host and port: ours first (runtime LoRA up to ``lora_rank`` when > 0),
    ``extra_args`` last (they win)."""
    args: list[str] = list(CPU_SERVE_ARGS) if settings.cpu_flags else []
    args += ["--served-model-name", str(settings.served_name)]
    args += ["--logprobs-mode", "processed_logprobs", "--worker-extension-cls", WORKER_EXTENSION]
    if settings.max_model_len is not None:
        args += ["--max-model-len", str(settings.max_model_len)]
    if lora_rank > 0:
        args += lora_serve_args(lora_rank)
    return (*args, *settings.extra_args)


def server_env(settings: ServerSettings, lora: bool = False) -> dict[str, str]:
    """Environment of a launched server: dev-mode routes (weight pushes), KV cache size, multiprocess engine, and
    the runtime LoRA routes when ``lora``."""
    return {
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc and /reset_prefix_cache; the server binds to settings.host
        "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # stock `vllm serve` (a test process may have set 0 for itself)
        **(LORA_ENV if lora else {}),
        **settings.extra_env,
    }


def launch_specs(settings: ServerSettings, model_dir: Path, log_dir: Path, lora_rank: int = 0) -> list[LaunchSpec]:
    """One :class:`LaunchSpec` per server: its port (given or free), cores and log file ``server-<i>.log``;
    ``lora_rank`` > 0 turns on runtime LoRA adapters up to that rank."""
    specs = []
    for i in range(settings.launch):
        port = settings.ports[i] if settings.ports else free_port(settings.host)
        specs.append(
            LaunchSpec(
                model_path=str(model_dir),
                host=settings.host,
                port=port,
                log_path=log_dir / f"server-{i}.log",
                serve_args=serve_args(settings, lora_rank),
                cores=settings.cores[i] if settings.cores else (),
                env=server_env(settings, lora=lora_rank > 0),
            )
        )
    return specs


def launch_servers(settings: ServerSettings, model_dir: Path, log_dir: Path, lora_rank: int = 0) -> list[Server]:
    """Start ``settings.launch`` servers on ``model_dir`` (runtime LoRA up to ``lora_rank`` when > 0) and wait until
    all are healthy.

    Raises:
        ConfigError: the settings cannot run on this machine (:func:`check_launch_here`); no server was started.
        ServerError: a server exited or was not healthy within ``startup_timeout_s`` (all are stopped).
    """
    check_launch_here(settings)
    start = time.monotonic()
    processes = launch_all(launch_specs(settings, model_dir, log_dir, lora_rank), settings.startup_timeout_s)
    urls = ", ".join(p.url for p in processes)
    print(f"{len(processes)} vllm server(s) healthy after {time.monotonic() - start:.1f} s: {urls}", file=sys.stderr)
    return [
        Server(
            ServerClient(p.url, settings.request_timeout_s, settings.max_inflight, settings.control_timeout_s),
            p,
            restarts_left=settings.restarts,
        )
        for p in processes
    ]


def open_fleet(settings: ServerSettings, model_dir: Path, log_dir: Path, lora_rank: int = 0) -> Fleet:
    """The engine's fleet: ``launch`` servers started on ``model_dir`` (logs in ``log_dir``), or the ``urls``.

    Raises:
        ServerError: a launched server never became healthy, or a URL does not answer ``/health``.
    """
    if settings.launch:
        servers = launch_servers(settings, model_dir, log_dir, lora_rank)
    else:
        servers = [
            Server(ServerClient(url, settings.request_timeout_s, settings.max_inflight, settings.control_timeout_s))
            for url in settings.urls
        ]
        for server in servers:
            if not server.client.healthy():
                raise ServerError(f"vllm server {server.url} does not answer /health (engine_kwargs.urls)")
    return Fleet(servers, settings.startup_timeout_s)
