"""Multi-turn episodes on 2 DDP ranks (gloo, CPU processes) against 1 process with the same global batch.

``tests/rollout/multiturn_run.py`` trains the tiny chat policy on ``Parity`` episodes for 2 steps (4 global prompts
per step) and validates after them. Each episode's seed comes from its prompt's position, so the ranks sample exactly
the episodes one process samples: the weights, the logged statistics (the episode counts summed over the ranks) and
the held-out pass@k must agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import base_env, run_processes
from tests.distributed.test_lightning_launch import TIMING, assert_same_numbers, max_gap, summary, weights
from tests.rollout.multiturn_setup import tokenizer_folder

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parent / "multiturn_run.py"
STEPS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multiturn")
    outs = {"one": root / "one", "ddp": root / "ddp"}
    commands = [
        ([sys.executable, str(WORKER), str(outs[name]), tokenizer_folder(), "--steps", str(STEPS), "--devices", str(n)],
         base_env())
        for name, n in (("one", 1), ("ddp", 2))
    ]  # fmt: skip
    for (argv, _), (status, output) in zip(commands, run_processes(commands, timeout=300)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"
    return outs


def test_two_ranks_train_what_one_process_trains_on_the_same_episodes(runs: dict[str, Path]) -> None:
    one = summary(runs["one"])
    assert max_gap(weights(runs["ddp"], 0), weights(runs["ddp"], 1)) == 0.0
    assert max_gap(weights(runs["one"]), weights(runs["ddp"])) < 2e-5  # a rank-dependent episode: ~lr (1e-3)
    for rank in range(2):
        ddp = summary(runs["ddp"], rank)
        for step in range(STEPS):
            assert_same_numbers(one["logged"][step], ddp["logged"][step], skip=(*TIMING, "rollout/environment_seconds"))
        assert_same_numbers(one["val"], ddp["val"])
    logged = one["logged"][0]
    assert 1.0 < logged["rollout/turns_per_episode"] <= 2.0 and logged["rollout/environment_errors"] == 0.0
    assert "val/pass_at_2" in one["val"]


def test_ranks_sharing_one_engine_take_part_in_every_turns_round() -> None:
    """Rank 1's episodes end after one turn, rank 0's after three: rank 1 joins rank 0's later rounds (also when it
    skips a dynamic-sampling round), and every rank's episodes are those the engine gives it alone."""
    worker = Path(__file__).resolve().parent / "multiturn_ranked_worker.py"
    env = base_env()
    commands = [([sys.executable, str(worker)], env | {"RANK": str(r), "WORLD_SIZE": "2"}) for r in range(2)]
    for rank, (status, output) in enumerate(run_processes(commands, timeout=120)):  # a hang raises TimeoutError
        assert status == 0 and "ranked episodes ok" in output, f"rank {rank}:\n{output[-3000:]}"


def test_the_base_models_row_and_the_warm_started_row_on_two_ranks_are_one_process_rows(tmp_path: Path) -> None:
    """``ConversationWarmStart(evaluate_base=True)`` under DDP: the base model's held-out row (before the warm start)
    and the row before RL, with the tool-call share, reduced over the ranks, equal one process's."""
    outs = {name: tmp_path / name for name in ("one", "ddp")}
    commands = [
        ([sys.executable, str(WORKER), str(outs[name]), tokenizer_folder(), "--steps", "1", "--devices", str(n),
          "--tools"], base_env())
        for name, n in (("one", 1), ("ddp", 2))
    ]  # fmt: skip
    for (argv, _), (status, output) in zip(commands, run_processes(commands, timeout=300)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"
    one = json.loads((outs["one"] / "stages0.json").read_text())
    assert {"pass_at_1", "ci95_pass_at_1", "tool_use"} <= set(one["base"]) and set(one["start"]) == set(one["base"])
    for rank in range(2):
        ddp = json.loads((outs["ddp"] / f"stages{rank}.json").read_text())
        for stage in ("base", "start"):
            assert_same_numbers(one[stage], ddp[stage])
