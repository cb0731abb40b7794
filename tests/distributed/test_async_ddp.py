"""Asynchronous rollouts (k = 1) on 2 DDP ranks over gloo: each rank its own ``hf_copy`` engine and generator thread.

``tests/distributed/workers/async_run.py`` runs under Lightning's ``ddp`` launcher, as a user's run does. The ranks
train on disjoint prompts (together, the stream's first positions, each once), every rollout is at most one policy
version old, and the all-reduced weights end equal on both ranks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import WORKERS, base_env, run_processes

pytestmark = pytest.mark.slow


def test_two_ranks_each_with_its_own_engine(tmp_path: Path) -> None:
    command = [sys.executable, str(WORKERS / "async_run.py"), str(tmp_path)]
    ((status, output),) = run_processes([(command, base_env())], timeout=240)
    assert status == 0, output[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for summary in ranks:
        assert summary["versions"] == [0, 0, 1] and summary["staleness"] == [0, 1, 1], summary
        assert summary["dropped"] == [0, 0, 0]
    # 4 prompts per step over 2 ranks: rank r takes positions r, r + 2 of each global batch of 4.
    assert ranks[0]["positions"] == [[0, 2], [4, 6], [8, 10]]
    assert ranks[1]["positions"] == [[1, 3], [5, 7], [9, 11]]
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0), "ranks diverged: gradients were not all-reduced"
