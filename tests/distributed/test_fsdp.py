"""FSDP2 (``strategy: model_parallel``) on 2 CPU ranks (gloo) through ``lit-fgrpo fit``, against one process.

The maze_tiny pipeline of ``workers/maze_run.py`` with a KL term (beta > 0: the frozen reference is sharded too):
after RL steps that moved the weights, the sharded ranks end with the one-process weights; every parameter is a
``DTensor`` shard of about half the elements; ``save_pretrained`` writes a normal HF folder; a run resumed from the
sharded step-2 checkpoint ends where the uninterrupted sharded run ends (exactly: max |dW| = 0). FSDP1 is refused in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lit_fgrpo.cli import main
from tests.distributed.launch import WORKERS, base_env, run_processes

pytestmark = pytest.mark.slow

TIMEOUT = 300  # a hung rank fails the test with the command's name
STEPS = 3


def _command(out: Path, *flags: str) -> list[str]:
    return [sys.executable, str(WORKERS / "maze_run.py"), str(out), "--steps", str(STEPS), "--beta", "0.05", *flags]


def _run(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    for (argv, _), (status, output) in zip(commands, run_processes(commands, TIMEOUT)):
        assert status == 0, f"{' '.join(argv[1:])} failed:\n{output[-4000:]}"


def _weights(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(out / f"rank{rank}.pt")


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fsdp_runs")
    names = ("one", "start", "sharded", "resumed", "nangrad", "lora_one", "lora_sharded")
    outs = {name: root / name for name in names}
    sharded = ("--devices", "2", "--strategy", "model_parallel")
    _run(
        [
            (_command(outs["one"]), base_env()),
            (_command(outs["sharded"], *sharded, "--ckpt-every", "2"), base_env()),
        ]
    )
    # the weights before RL: the same pipeline with no RL step after the warm start
    start = [sys.executable, str(WORKERS / "maze_run.py"), str(outs["start"]), "--steps", "0", "--beta", "0.05"]
    # rank 1's gradient shard gets a NaN at step 1 (its loss and rank 0's shards stay finite)
    nangrad = ("--warm-steps", "0", "--fail-rank", "1", "--fail-kind", "nangrad")
    _run([(start, base_env()), (_command(outs["nangrad"], *sharded, *nangrad), base_env())])
    lora = ("--lora", "--warm-steps", "0")  # the merged weights start at the seeded init (LoRA's B is 0)
    _run(
        [(_command(outs["lora_one"], *lora), base_env()), (_command(outs["lora_sharded"], *sharded, *lora), base_env())]
    )
    return outs


def test_two_sharded_ranks_match_one_process_after_rl_steps_that_moved_the_weights(runs: dict[str, Path]) -> None:
    one, sharded = _weights(runs["one"]), _weights(runs["sharded"])
    assert _gap(one, _weights(runs["start"])) > 1e-3  # RL moved the weights (Adam steps of ~lr = 1e-3)
    assert _gap(one, sharded) < 1e-4
    assert _gap(sharded, _weights(runs["sharded"], 1)) == 0.0


def test_parameters_are_dtensor_shards_of_about_half_on_each_rank(runs: dict[str, Path]) -> None:
    import json

    full = _weights(runs["one"])
    for rank in range(2):
        shards = json.loads((runs["sharded"] / f"rank{rank}.shards.json").read_text())
        assert shards and all(entry["dtensor"] for entry in shards.values())
        local = sum(entry["local"] for entry in shards.values())
        total = sum(full[name].numel() for name in shards)
        assert abs(local / total - 0.5) < 0.02, (rank, local, total)


def test_save_pretrained_from_the_sharded_policy_loads_in_transformers(runs: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(runs["sharded"] / "policy")
    state, trained = model.state_dict(), _weights(runs["sharded"])
    assert max(float((state[k] - trained[k]).abs().max()) for k in trained) == 0.0


def test_resume_under_sharding_equals_the_uninterrupted_sharded_run(runs: dict[str, Path]) -> None:
    checkpoint = runs["sharded"] / "ckpt" / "epoch=0-step=2.ckpt"
    sharded = ("--devices", "2", "--strategy", "model_parallel", "--resume", str(checkpoint))
    _run([(_command(runs["resumed"], *sharded), base_env())])
    for rank in range(2):
        gap = _gap(_weights(runs["resumed"], rank), _weights(runs["sharded"], rank))
        print(f"rank {rank}: max |dW| resumed vs uninterrupted = {gap:.3g}")
        assert gap < 1e-6


def test_fsdp1_is_refused_in_one_line_with_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--config", "configs/maze_tiny.yaml", "--trainer.strategy", "fsdp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "error: --trainer.strategy fsdp (FSDP1) is not supported; use --trainer.strategy model_parallel"
    )


@pytest.mark.parametrize("name", ["sharded", "lora_sharded"])
def test_the_memory_plan_equals_each_ranks_real_shards(runs: dict[str, Path], name: str) -> None:
    """The plan's parameter and AdamW bytes per rank against the bytes the sharded run holds on that rank."""
    import json

    from jsonargparse import Namespace

    from lit_fgrpo.commands.plan import architecture, policy_shapes
    from lit_fgrpo.distributed.memory_plan import PlanSettings, memory_plan
    from lit_fgrpo.models.lora import LoraSettings
    from tests.training.tiny_setup import MAZE_TINY_MODEL

    lora = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]) if "lora" in name else None
    model = Namespace(model_config=dict(MAZE_TINY_MODEL), tokenizer="builtin:maze", model=None)
    shapes = policy_shapes(architecture(model, None), lora)
    for rank in range(2):
        shards = json.loads((runs[name] / f"rank{rank}.shards.json").read_text())
        plan = memory_plan(shapes, PlanSettings(2, True, False, 4, reference=False), rank=rank)
        assert plan.bytes_of("parameters") == sum(e["local"] * e["element_size"] for e in shards.values())
        assert plan.bytes_of("AdamW moments") == sum(e["moment_bytes"] for e in shards.values())
        trained = sum(e["local"] * e["element_size"] for e in shards.values() if e["trainable"])
        assert plan.bytes_of("gradients") == trained


def test_a_nan_in_one_ranks_gradient_shard_makes_every_rank_skip_the_same_step(runs: dict[str, Path]) -> None:
    import json

    out = runs["nangrad"]
    for rank in range(2):
        summary = json.loads((out / f"rank{rank}.json").read_text())
        # batch 1 is skipped on both ranks, so reaching max_steps takes one batch more
        assert [step["train/nonfinite_skips"] for step in summary["logged"]] == [0.0] + [1.0] * STEPS, rank
        shards = json.loads((out / f"rank{rank}.shards.json").read_text())
        # AdamW stepped STEPS times in STEPS + 1 batches on this rank's shards: the skipped batch stepped none
        assert {entry["adam_steps"] for entry in shards.values()} == {float(STEPS)}, rank
    assert _gap(_weights(out, 0), _weights(out, 1)) == 0.0


def test_lora_under_sharding_matches_one_process_and_saves_merged_weights(runs: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.models.policy import build_policy
    from lit_fgrpo.tasks.registry import load_tokenizer
    from tests.training.tiny_setup import MAZE_TINY_MODEL

    one, sharded = _weights(runs["lora_one"]), _weights(runs["lora_sharded"])
    assert not any("lora_" in key for key in sharded)  # merged weights under the base model's names
    init = build_policy(None, MAZE_TINY_MODEL, load_tokenizer("builtin:maze"), seed=0).state_dict()
    assert _gap(one, {k: init[k] for k in one}) > 1e-3  # the RL steps moved the merged weights
    assert _gap(one, sharded) < 1e-4  # the merged pushes to the engine were right at every step
    state = AutoModelForCausalLM.from_pretrained(runs["lora_sharded"] / "policy").state_dict()
    assert max(float((state[k] - sharded[k]).abs().max()) for k in sharded) == 0.0
