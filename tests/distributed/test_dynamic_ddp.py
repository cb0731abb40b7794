"""Dynamic sampling on 2 DDP ranks (gloo, CPU processes): lockstep rounds, disjoint draws, exact resume, failures.

``tests/distributed/workers/maze_run.py --dynamic`` trains with a reward that makes about half of the groups constant
(by a hash of the prompt), so every step needs more prompts than P and the ranks need different numbers of them.
Each rank records the prompts its rounds drew and its data module's draw cursor after every step.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import WORKERS, base_env, run_processes
from tests.distributed.test_lightning_launch import TIMING, assert_same_numbers, max_gap, summary, weights

pytestmark = pytest.mark.slow

STEPS, P = 3, 4


def _command(out: Path, *flags: str) -> list[str]:
    return [
        sys.executable, str(WORKERS / "maze_run.py"), str(out), "--steps", str(STEPS), "--devices", "2",
        "--warm-steps", "0", "--dynamic", *flags,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """A 2-rank run (checkpoint at step 2) beside one whose rank 1 crashes in its step-1 rollout and one that comes up
    short with ``on_short="error"``; then a resume."""
    root = tmp_path_factory.mktemp("dynamic")
    outs = {name: root / name for name in ("ddp", "crash", "short", "resumed")}
    commands = [
        (_command(outs["ddp"], "--ckpt-every", "2"), base_env()),
        (_command(outs["crash"], "--fail-rank", "1", "--fail-kind", "rollout"), base_env()),
        (_command(outs["short"], "--dynamic-short-error"), base_env()),
    ]
    results = run_processes(commands, timeout=300)
    assert results[0][0] == 0, results[0][1][-4000:]
    checkpoint = outs["ddp"] / "ckpt" / "epoch=0-step=2.ckpt"
    resumed = run_processes([(_command(outs["resumed"], "--resume", str(checkpoint)), base_env())], timeout=300)
    return {name: (status, output, outs[name]) for name, (status, output) in zip(outs, [*results, *resumed])}


def test_ranks_make_the_same_rounds_and_draw_disjoint_prompts_in_order(runs: dict) -> None:
    out = runs["ddp"][2]
    rank0, rank1 = summary(out, 0), summary(out, 1)
    # the same number of prompts drawn on both ranks every step: rank 0's checkpointed cursor is right for rank 1
    assert rank0["cursor"] == rank1["cursor"]
    assert [len(d) for d in rank0["drawn"]] == [len(d) for d in rank1["drawn"]]
    # each rank draws its own shard (rank r: global positions r, r + 2, ...), in order, none twice
    for rank, result in enumerate((rank0, rank1)):
        flat = [p for step in result["drawn"] for p in step]
        assert flat == list(range(rank, 2 * len(flat), 2))
        assert len(flat) == result["cursor"][-1]
    assert rank0["cursor"][-1] > STEPS * P // 2  # groups were dropped: more drawn than trained
    for step in range(STEPS):
        logged = rank0["logged"][step]
        assert_same_numbers(logged, rank1["logged"][step], skip=TIMING)  # global values on both ranks
        assert logged["rollout/dynamic_groups_kept"] == P and logged["rollout/dynamic_groups_padded"] == 0
        assert logged["rollout/frac_active_groups"] == 1.0  # every trained group informative, on both ranks
        assert logged["rollout/dynamic_prompts_drawn"] == 2 * len(rank0["drawn"][step])  # summed over ranks
    # a step where one rank had its groups and consumed the other rank's extra round without generating
    assert any(step["rollout/dynamic_prompts_skipped"] > 0 for step in rank0["logged"])
    assert max_gap(weights(out, 0), weights(out, 1)) == 0.0  # the gradients were all-reduced


def test_resume_on_two_ranks_draws_what_the_uninterrupted_run_drew(runs: dict) -> None:
    status, output, out = runs["resumed"]
    assert status == 0, output[-4000:]
    uninterrupted = runs["ddp"][2]
    for rank in range(2):
        resumed, straight = summary(out, rank), summary(uninterrupted, rank)
        assert resumed["drawn"] == straight["drawn"][-1:]  # step 3 only, the prompts after the saved cursor
        assert resumed["cursor"] == straight["cursor"][-1:]
        assert_same_numbers(resumed["logged"][0], straight["logged"][-1], skip=TIMING)
        assert max_gap(weights(out, rank), weights(uninterrupted, rank)) < 1e-6


def test_a_crash_in_a_round_on_rank_1_stops_every_rank_with_its_message(runs: dict) -> None:
    status, output, out = runs["crash"]
    assert status != 0
    error = "ValueError: reward function maze crashed on rank 1"
    assert f"rank 1 failed in the dynamic-sampling rollout at step 1: {error}" in output, output[-3000:]
    assert not (out / "rank0.pt").exists()


def test_a_rank_left_short_with_on_short_error_stops_every_rank(runs: dict) -> None:
    # one round of P / W = 2 prompts per rank; about half of the groups are constant, so a rank comes up short
    status, output, out = runs["short"]
    assert status != 0
    assert re.search(r"RuntimeError: dynamic_sampling: [01] informative groups of 2 after 1 rounds", output), output[
        -3000:
    ]
    assert re.search(
        r"rank [01] failed in the dynamic-sampling rollout at step \d+: RuntimeError: dynamic_sampling", output
    )
    assert not (out / "rank0.pt").exists() and not (out / "rank1.pt").exists()
