"""Start real processes for the multi-rank tests: ranks of a raw gloo group, or a Lightning launch as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from lit_fgrpo.servers.process import child_environment

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_env(threads: int = 1) -> dict[str, str]:
    env = child_environment()
    env |= {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": str(REPO),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    return env


def run_processes(commands: list[tuple[list[str], dict[str, str]]], timeout: float) -> list[tuple[int, str]]:
    """Run the commands side by side; (exit status, stdout + stderr) of each. A hang is killed at ``timeout``.

    Raises:
        TimeoutError: If any process is still running after ``timeout`` seconds (all are killed first).
    """
    procs = [
        subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for argv, env in commands
    ]
    results: list[tuple[int, str]] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out))
    except subprocess.TimeoutExpired as err:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # the session of a process we started: it and the children it spawned
        raise TimeoutError(f"multi-process test still running after {timeout} s (a hang): {err.cmd}") from None
    return results


def group_ranks(worker_args: list[str], world: int = 2, timeout: float = 60) -> list[tuple[int, str]]:
    """Run ``workers/group_worker.py`` as ``world`` ranks of one process group (RANK / WORLD_SIZE / MASTER_* env)."""
    env = base_env()
    commands = []
    for rank in range(world):
        rank_env = env | {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        commands.append(([sys.executable, str(WORKERS / "group_worker.py"), *worker_args], rank_env))
    return run_processes(commands, timeout)


def run_vllm_script(script: Path, source: str, marker: str, timeout: float = 600) -> None:
    """Write ``source`` to ``script`` and run it in a fresh interpreter with vLLM in multiprocess mode (its engine in
    a process of its own); assert that it exits 0 and prints ``marker``."""
    script.write_text(source)
    env = child_environment({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and marker in proc.stdout, proc.stderr[-4000:]
