"""bfloat16 decoding (``--rollout.decode_dtype bfloat16``) under DDP: 2 ranks equal 1 process, and it is in effect.

``tests/distributed/workers/maze_run.py`` (the maze_tiny pipeline through ``lit-fgrpo fit``) with LoRA: the frozen
base weights are cast and packed once per rank, the adapters stay float32. Each rank's HF engine samples its own
prompts with their own seeds, so the global batch, and with it the trained weights, must not depend on the layout.
The engine-vs-trainer log-prob gap (``rollout/logprob_mismatch``) shows that the rollouts came from the bfloat16
policy: far above the float32 run's, which is rounding only (the tiny policy is so sure of its replies that both
draw the same tokens, so the weights agree too).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.distributed.launch import WORKERS, base_env, run_processes
from tests.distributed.test_lightning_launch import max_gap, summary, weights

pytestmark = pytest.mark.slow

TIMEOUT = 300
STEPS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decode_dtype")
    outs = {name: root / name for name in ("one", "ddp", "float32")}
    flags = {"one": [], "ddp": ["--devices", "2"], "float32": []}
    commands = []
    for name, out in outs.items():
        dtype = "float32" if name == "float32" else "bfloat16"
        argv = [sys.executable, str(WORKERS / "maze_run.py"), str(out), "--steps", str(STEPS), "--lora",
                "--decode-dtype", dtype, *flags[name]]  # fmt: skip
        commands.append((argv, base_env()))
    for (argv, _), (status, output) in zip(commands, run_processes(commands, TIMEOUT)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"
    return outs


def test_two_ranks_decoding_in_bfloat16_train_the_weights_of_one_process(runs: dict[str, Path]) -> None:
    assert max_gap(weights(runs["ddp"], 0), weights(runs["ddp"], 1)) == 0.0
    assert max_gap(weights(runs["one"]), weights(runs["ddp"])) < 2e-5


def test_the_rollouts_come_from_the_bfloat16_policy(runs: dict[str, Path]) -> None:
    bf16 = [step["rollout/logprob_mismatch"] for step in summary(runs["one"])["logged"]]
    fp32 = [step["rollout/logprob_mismatch"] for step in summary(runs["float32"])["logged"]]
    ranks = [step["rollout/logprob_mismatch"] for r in range(2) for step in summary(runs["ddp"], r)["logged"]]
    # the tiny policy's replies are nearly certain, so the gap is small (~3e-4) but ~3,000 times float32's rounding
    assert len(bf16) == STEPS and min(bf16 + ranks) > 1e-4 > 1e-6 > max(fp32)
