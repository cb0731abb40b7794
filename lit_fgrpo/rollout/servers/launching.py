"""Launched mode: the ``vllm serve`` command lines for ``launch: N`` and starting them as fleet members."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from lit_fgrpo.rollout.servers.client import ServerClient
from lit_fgrpo.rollout.servers.extension import WORKER_EXTENSION
from lit_fgrpo.rollout.servers.fleet import Server
from lit_fgrpo.rollout.servers.process import LaunchSpec, free_port, launch_all
from lit_fgrpo.rollout.servers.settings import CPU_SERVE_ARGS, ServerSettings


def serve_args(settings: ServerSettings) -> tuple[str, ...]:
    """``vllm serve`` arguments after model, host and port: ours first, ``extra_args`` last (they win)."""
    args: list[str] = list(CPU_SERVE_ARGS) if settings.cpu_flags else []
    args += ["--served-model-name", str(settings.served_name)]
    args += ["--logprobs-mode", "processed_logprobs", "--worker-extension-cls", WORKER_EXTENSION]
    if settings.max_model_len is not None:
        args += ["--max-model-len", str(settings.max_model_len)]
    return (*args, *settings.extra_args)


def server_env(settings: ServerSettings) -> dict[str, str]:
    """Environment of a launched server: dev-mode routes (weight pushes), KV cache size, multiprocess engine."""
    return {
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc and /reset_prefix_cache; the server binds to settings.host
        "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # stock `vllm serve` (a test process may have set 0 for itself)
        **settings.extra_env,
    }


def launch_specs(settings: ServerSettings, model_dir: Path, log_dir: Path) -> list[LaunchSpec]:
    """One :class:`LaunchSpec` per server: its port (given or free), cores and log file ``server-<i>.log``."""
    specs = []
    for i in range(settings.launch):
        port = settings.ports[i] if settings.ports else free_port(settings.host)
        specs.append(
            LaunchSpec(
                model_path=str(model_dir),
                host=settings.host,
                port=port,
                log_path=log_dir / f"server-{i}.log",
                serve_args=serve_args(settings),
                cores=settings.cores[i] if settings.cores else (),
                env=server_env(settings),
            )
        )
    return specs


def launch_servers(settings: ServerSettings, model_dir: Path, log_dir: Path) -> list[Server]:
    """Start ``settings.launch`` servers on ``model_dir`` and wait until all are healthy.

    Raises:
        ServerError: a server exited or was not healthy within ``startup_timeout_s`` (all are stopped).
    """
    start = time.monotonic()
    processes = launch_all(launch_specs(settings, model_dir, log_dir), settings.startup_timeout_s)
    urls = ", ".join(p.url for p in processes)
    print(f"{len(processes)} vllm server(s) healthy after {time.monotonic() - start:.1f} s: {urls}", file=sys.stderr)
    return [
        Server(
            ServerClient(p.url, settings.request_timeout_s, settings.max_inflight), p, restarts_left=settings.restarts
        )
        for p in processes
    ]
