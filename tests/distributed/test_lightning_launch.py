"""The maze_tiny pipeline under Lightning's own launchers: DDP on 2 CPU processes (gloo) and two simulated nodes.

Each run is ``tests/distributed/workers/maze_run.py`` in fresh processes, launched as a user launches
``lit-fgrpo fit``: Lightning's ``ddp`` launcher re-runs the script for rank 1; for two nodes, one process per node
with ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK`` and ``WORLD_SIZE``. Every rank writes its final weights.
The same global batch (4 prompts per step) runs on 1 process and on 2 ranks; the weights must agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.launch import WORKERS, base_env, run_processes

pytestmark = pytest.mark.slow

TIMEOUT = 240  # a hang fails the test instead of the CI job


def _command(out: Path, *flags: str) -> list[str]:
    return [sys.executable, str(WORKERS / "maze_run.py"), str(out), *flags]


def launch(root: Path, per_prompt_seeds: bool, two_nodes: bool = True) -> dict[str, Path]:
    """Run the 1-process, the 2-device DDP and (optionally) the 2-node layouts side by side; their output folders."""
    seeds = ["--per-prompt-seeds"] if per_prompt_seeds else []
    outs = {"one": root / "one", "ddp": root / "ddp", "nodes": root / "nodes"}
    commands = [
        (_command(outs["one"], *seeds), base_env()),
        (_command(outs["ddp"], "--devices", "2", *seeds), base_env()),
    ]
    if two_nodes:
        env = base_env() | {"WORLD_SIZE": "2"}
        for node in range(2):
            commands.append((_command(outs["nodes"], "--num-nodes", "2", *seeds), env | {"NODE_RANK": str(node)}))
    for (argv, _), (status, output) in zip(commands, run_processes(commands, TIMEOUT)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"
    return outs


def weights(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(out / f"rank{rank}.pt")


def summary(out: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return launch(tmp_path_factory.mktemp("seeded"), per_prompt_seeds=True)


def test_ddp_ranks_share_the_global_batch_and_stay_in_sync(seeded: dict[str, Path]) -> None:
    one, rank0, rank1 = summary(seeded["one"]), summary(seeded["ddp"], 0), summary(seeded["ddp"], 1)
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert one["positions"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # global batch t = positions [4t, 4t + 4)
    assert rank0["positions"] == [[0, 2], [4, 6]] and rank1["positions"] == [[1, 3], [5, 7]]
    assert min(rank0["frac_active_groups"] + rank1["frac_active_groups"]) > 0  # both ranks had gradients
    # Different prompts on each rank, identical weights after: the gradients were all-reduced.
    assert max_gap(weights(seeded["ddp"], 0), weights(seeded["ddp"], 1)) == 0.0


def test_ddp_matches_one_process_with_the_same_global_batch(seeded: dict[str, Path]) -> None:
    one, ddp = weights(seeded["one"]), weights(seeded["ddp"])
    # One Adam step moves weights by ~lr = 1e-3; a rank-dependent rollout shows as a gap of that size.
    assert max_gap(one, ddp) < 2e-5


def test_two_simulated_nodes_match_one_process(seeded: dict[str, Path]) -> None:
    node0, node1 = summary(seeded["nodes"], 0), summary(seeded["nodes"], 1)
    assert node0["world_size"] == node1["world_size"] == 2
    assert node1["positions"] == [[1, 3], [5, 7]]  # NODE_RANK=1 is global rank 1
    assert max_gap(weights(seeded["nodes"], 0), weights(seeded["nodes"], 1)) == 0.0
    assert max_gap(weights(seeded["nodes"]), weights(seeded["one"])) < 2e-5


@pytest.mark.xfail(
    strict=False,
    reason="RolloutCallback seeds a whole rank's generate call with seed + step (issue 9, item 3): which completions "
    "a prompt gets depends on the rank layout until the collector samples each prompt with prompt_seed(seed, "
    "record.position, step); --per-prompt-seeds above is that change and passes",
)
def test_ddp_matches_one_process_as_shipped(tmp_path: Path) -> None:
    outs = launch(tmp_path, per_prompt_seeds=False, two_nodes=False)
    assert max_gap(weights(outs["one"]), weights(outs["ddp"])) < 2e-5


def test_a_failure_on_rank_1_stops_the_ddp_run_with_its_message(tmp_path: Path) -> None:
    # Rank 1 (the process Lightning's launcher started) crashes in its rollout at step 1; without fail_together
    # rank 0 would wait in the next gradient all-reduce for the process-group timeout (30 minutes).
    command = _command(tmp_path, "--devices", "2", "--steps", "3", "--fail-rank", "1")
    ((status, output),) = run_processes([(command, base_env())], timeout=120)
    assert status != 0
    assert "ValueError: reward function maze crashed on rank 1" in output  # rank 1's own exception
    message = "rank 1 failed in rollout scoring at step 1: ValueError: reward function maze crashed on rank 1"
    assert message in output  # rank 0 stops with the original message
    assert not (tmp_path / "rank0.pt").exists()
