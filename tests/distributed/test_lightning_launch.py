"""The maze_tiny pipeline under Lightning's own launchers: DDP on 2 CPU processes (gloo) and two simulated nodes.

Each run is ``tests/distributed/workers/maze_run.py`` in fresh processes, launched as a user launches
``lit-fgrpo fit``: Lightning's ``ddp`` launcher re-runs the script for rank 1; for two nodes, one process per node
with ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK`` and ``WORLD_SIZE``. Every rank writes its final weights, the
logged ``rollout/*`` and ``focal/*`` statistics and the final validation metrics. The same global batch (4 prompts
per step, 3 steps) runs on 1 process, on 2 ranks, on 2 nodes and on 2 ranks resumed from the step-2 checkpoint of
the 2-rank run: all must agree. The two nodes also cut their micro-batches by a token budget
(``--model.batching.micro_batch_tokens``): ranks then run different numbers of backwards, and the update is the same. The runs are shared by the assertions (one launch per layout).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.launch import WORKERS, base_env, run_processes

pytestmark = pytest.mark.slow

TIMEOUT = 300  # a hang fails the test instead of the CI job
STEPS = 3
BUDGET = 240
"""The nodes run's padded tokens per micro-batch: two rows of the 4x4 maze's 94-token prompt and replies of at most
16 tokens (instead of all 16 rows of a rank in one)."""
TIMING = ("rollout/tokens_per_s", "rollout/generation_seconds", "rollout/logprob_mismatch")
"""Logged values that are per-rank by nature (throughput, wall time, this rank's engine-vs-trainer gap)."""


def _command(out: Path, *flags: str) -> list[str]:
    return [sys.executable, str(WORKERS / "maze_run.py"), str(out), "--steps", str(STEPS), *flags]


def _run(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    for (argv, _), (status, output) in zip(commands, run_processes(commands, TIMEOUT)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """1 process, 2 DDP ranks (checkpoint at step 2), 2 nodes; then 2 ranks resumed from that checkpoint."""
    root = tmp_path_factory.mktemp("maze_runs")
    outs = {name: root / name for name in ("one", "ddp", "nodes", "resumed")}
    commands = [
        (_command(outs["one"], "--validate"), base_env()),
        (_command(outs["ddp"], "--devices", "2", "--validate", "--ckpt-every", "2"), base_env()),
    ]
    env = base_env() | {"WORLD_SIZE": "2"}
    for node in range(2):
        nodes = _command(outs["nodes"], "--num-nodes", "2", "--validate", "--micro-batch-tokens", str(BUDGET))
        commands.append((nodes, env | {"NODE_RANK": str(node)}))
    _run(commands)
    checkpoint = outs["ddp"] / "ckpt" / "epoch=0-step=2.ckpt"
    _run([(_command(outs["resumed"], "--devices", "2", "--validate", "--resume", str(checkpoint)), base_env())])
    return outs


def weights(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(out / f"rank{rank}.pt")


def summary(out: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_same_numbers(a: dict[str, float], b: dict[str, float], skip: tuple[str, ...] = ()) -> None:
    keys = set(a) - set(skip)
    assert keys and keys == set(b) - set(skip)
    for key in sorted(keys):
        assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-6), (key, a[key], b[key])


def test_ddp_ranks_share_the_global_batch_and_stay_in_sync(runs: dict[str, Path]) -> None:
    one, rank0, rank1 = summary(runs["one"]), summary(runs["ddp"], 0), summary(runs["ddp"], 1)
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert one["positions"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # global batch t: [4t, 4t + 4)
    assert rank0["positions"] == [[0, 2], [4, 6], [8, 10]] and rank1["positions"] == [[1, 3], [5, 7], [9, 11]]
    assert min(rank0["frac_active_groups"] + rank1["frac_active_groups"]) > 0  # both ranks had gradients
    # Different prompts on each rank, identical weights after: the gradients were all-reduced.
    assert max_gap(weights(runs["ddp"], 0), weights(runs["ddp"], 1)) == 0.0


def test_ddp_matches_one_process_with_the_same_global_batch(runs: dict[str, Path]) -> None:
    # One Adam step moves weights by ~lr = 1e-3; a rank-dependent rollout shows as a gap of that size.
    assert max_gap(weights(runs["one"]), weights(runs["ddp"])) < 2e-5


def test_logged_rollout_and_focal_statistics_are_those_of_the_global_batch(runs: dict[str, Path]) -> None:
    one = summary(runs["one"])["logged"]
    for rank in range(2):
        ddp = summary(runs["ddp"], rank)["logged"]
        assert len(one) == len(ddp) == STEPS
        for step in range(STEPS):
            assert_same_numbers(one[step], ddp[step], skip=TIMING)
    # the focal weights are informative here (0 < mu_hat < 1 in some group), not all 1
    assert min(step["focal/weight_min"] for step in one) < 1.0
    # a token budget counts every rank's generation: the same running total as one process
    totals = [step["rollout/generated_tokens_total"] for step in one]
    assert totals == list(itertools.accumulate(step["rollout/generated_tokens"] for step in one)) and totals[0] > 0


def test_validation_pass_at_k_on_two_ranks_equals_one_process(runs: dict[str, Path]) -> None:
    one = summary(runs["one"])["val"]
    assert {"val/pass_at_1", "val/pass_at_4", "val/reward_mean"} <= set(one)
    assert 0 < one["val/pass_at_1"] < 1  # not a trivial agreement
    for rank in range(2):
        assert_same_numbers(one, summary(runs["ddp"], rank)["val"])


def test_two_simulated_nodes_match_one_process(runs: dict[str, Path]) -> None:
    node0, node1 = summary(runs["nodes"], 0), summary(runs["nodes"], 1)
    assert node0["world_size"] == node1["world_size"] == 2
    assert node1["positions"] == [[1, 3], [5, 7], [9, 11]]  # NODE_RANK=1 is global rank 1
    assert max_gap(weights(runs["nodes"], 0), weights(runs["nodes"], 1)) == 0.0
    assert max_gap(weights(runs["nodes"]), weights(runs["one"])) < 2e-5


def test_resume_on_two_ranks_equals_the_uninterrupted_run(runs: dict[str, Path]) -> None:
    resumed, uninterrupted = summary(runs["resumed"]), summary(runs["ddp"])
    assert resumed["positions"] == [[8, 10]]  # only step 3 ran, on the prompts the uninterrupted run had there
    assert_same_numbers(resumed["logged"][0], uninterrupted["logged"][-1], skip=TIMING)
    assert_same_numbers(resumed["val"], uninterrupted["val"])
    for rank in range(2):
        assert max_gap(weights(runs["resumed"], rank), weights(runs["ddp"], rank)) < 1e-6


FAILURES = {
    "rollout": ("rollout at step 1", "ValueError: reward function maze crashed on rank 1"),
    "sync": ("weight sync at step 0", "WeightSyncError: "),
}
# A NaN loss is not a crash: the non-finite guard (issue 10) skips the step on every rank (the all-reduced
# gradients are NaN everywhere), and after --model.optimizer.max_nonfinite_skips in a row every rank stops, naming the step.
NAN_ERROR = "NonFiniteError: step 1: "


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The three failures on rank 1 of a 2-rank DDP run, side by side (no warm start: they fail early)."""
    root = tmp_path_factory.mktemp("failures")
    commands = [
        (
            _command(root / kind, "--devices", "2", "--warm-steps", "0", "--fail-rank", "1", "--fail-kind", kind),
            base_env(),
        )
        for kind in [*FAILURES, "nan"]
    ]
    # and a run where rank 1 skips every row (zero advantages): padded backwards keep DDP's all-reduces in step
    flat = ["--devices", "2", "--warm-steps", "0", "--flat-reward-rank", "1"]
    commands.append((_command(root / "flat", *flat), base_env()))
    results = run_processes(commands, timeout=180)
    kinds = [*FAILURES, "nan", "flat"]
    return {kind: (status, output, root / kind) for kind, (status, output) in zip(kinds, results, strict=True)}


def test_a_rank_with_no_active_group_does_not_hang_ddp(failures: dict[str, tuple[int, str, Path]]) -> None:
    status, output, out = failures["flat"]
    assert status == 0, output[-3000:]
    rank0, rank1 = summary(out, 0), summary(out, 1)
    for step in range(STEPS):  # rank 1's half of the groups is inactive, rank 0 has active ones
        assert 0 < rank0["logged"][step]["rollout/frac_active_groups"] <= 0.5
        assert_same_numbers(rank0["logged"][step], rank1["logged"][step], skip=TIMING)  # reduced on both ranks
    assert max_gap(weights(out, 0), weights(out, 1)) == 0.0  # rank 1 took part in every gradient all-reduce


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_failure_on_rank_1_stops_every_rank_with_its_message(
    failures: dict[str, tuple[int, str, Path]], kind: str
) -> None:
    # Without fail_together rank 0 would wait in the next collective for the process-group timeout (30 minutes).
    status, output, out = failures[kind]
    what, error = FAILURES[kind]
    assert status != 0
    assert error in output  # rank 1's own exception
    assert f"rank 1 failed in the {what}: {error}" in output, output[-3000:]  # rank 0 stops with that message
    assert not (out / "rank0.pt").exists()


def test_a_nan_loss_on_rank_1_skips_then_stops_every_rank(failures: dict[str, tuple[int, str, Path]]) -> None:
    status, output, out = failures["nan"]
    assert status != 0
    assert NAN_ERROR in output and "is not finite for the 5th step in a row; stopping" in output, output[-3000:]
    assert "step 1: loss is not finite" in output  # rank 1 names its own loss
    assert not (out / "rank0.pt").exists()
