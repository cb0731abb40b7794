"""The rounds of :class:`~lit_fgrpo.servers.ranks.RankedEngine` on 2 real gloo ranks, a fake inner engine.

The ordering logic alone (``workers/ranked_worker.py`` says why the fake): each rank gets its own rows of one call on
rank 0's engine, uneven evaluation passes end together, a skipping rank joins a round, a generator thread's round
does not mix with a default-group all-reduce, and rank 0's errors reach every rank as one line.
"""

from __future__ import annotations

import sys

import pytest

from tests.distributed.launch import WORKERS, base_env, run_processes

pytestmark = pytest.mark.slow


def test_two_ranks_share_one_engine_on_rank_0() -> None:
    env = base_env()
    commands = [
        ([sys.executable, str(WORKERS / "ranked_worker.py")], env | {"RANK": str(r), "WORLD_SIZE": "2"})
        for r in range(2)
    ]
    for rank, (status, output) in enumerate(run_processes(commands, timeout=120)):  # a hang raises TimeoutError
        assert status == 0 and "ranked engine ok" in output, f"rank {rank}:\n{output[-3000:]}"
