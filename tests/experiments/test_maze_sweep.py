"""The resumable maze sweep on a tiny setting (2 arms x 2 seeds): interruption, resume, bad input, ΔNLL_rare = 0."""

from __future__ import annotations

import copy
import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from lit_fgrpo.experiments.maze_sweep import EXIT_INCOMPLETE, main, run_maze_sweep
from lit_fgrpo.experiments.rare_pool import RarePool, pack_pool, score_nll
from lit_fgrpo.tasks import MazeConfig, TinyPolicyConfig, build_tiny_policy, build_word_tokenizer, make_maze_splits
from lit_fgrpo.tasks.maze import MAZE_VOCAB, maze_prompt_tokens, maze_target_tokens
from tests.training.tiny_setup import MAZE_TINY_MODEL

TINY: dict[str, Any] = dict(
    arms=["4:0", "4:1"], seeds=[0, 1], rl_steps=3, milestones=[1], prompts_per_step=4, warm_start_steps=60,
    eval_samples=8, ks=[1, 8], maze_rows=2, maze_cols=3, maze_seed=7, num_train=200, num_val=8, num_test=8,
    val_samples=4, dnll_prompts=16, dnll_samples=16, dnll_top_fraction=0.25, warm_start_lr=3e-3,
    model_config=MAZE_TINY_MODEL, tracking_uri=None, ckpt_every=1,
)  # fmt: skip
RESULT = ("pass_at_1", "pass_at_8", "dnll_rare", "dnll_mean", "base_pass_at_1", "start_val_pass_at_1")


def _key(row: dict[str, Any]) -> tuple[int, int, float, int]:
    return int(row["seed"]), int(row["group_size"]), float(row["gamma"]), int(row["rl_steps"])


def _status(out: Path) -> dict[str, Any]:
    return json.loads((out / "sweep_status.json").read_text())


@pytest.mark.slow
def test_sweep_survives_interruption_and_skips_finished_arms(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    # 1) Stopped by its step budget in the middle of seed 0's second arm (steps 1..3 of N4_g0, then 2 of N4_g1).
    assert main(["--config", str(config), "--out_dir", str(out), "--step_budget", "5"]) == EXIT_INCOMPLETE
    first = _status(out)
    assert first["steps_trained_last_run"] == 5 and not first["complete"]
    assert first["pending"] == ["seed0/N4_g1@3", "seed1/N4_g0@1", "seed1/N4_g0@3", "seed1/N4_g1@1", "seed1/N4_g1@3"]
    step = torch.load(out / "seed0" / "N4_g1" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert step == 2  # the interrupted arm kept its checkpoint mid-way between milestones
    before = {_key(r): r for r in csv.DictReader((out / "seed0" / "maze_sweep.csv").open())}
    assert sorted(before) == [(0, 4, 0.0, 1), (0, 4, 0.0, 3), (0, 4, 1.0, 1)]

    # 2) The same command again finishes: 1 step of the interrupted arm + 2 x 3 of seed 1, nothing recomputed.
    # (As if the first run had died between saving seed 0's warm start and evaluating it: only the evaluation reruns.)
    (out / "seed0" / "base.json").unlink()
    weights = out / "seed0" / "warm_start" / "model.safetensors"
    saved_at = weights.stat().st_mtime_ns
    assert main(["--config", str(config), "--out_dir", str(out)]) == 0
    assert weights.stat().st_mtime_ns == saved_at  # the warm start was loaded, not trained again
    second = _status(out)
    assert second["complete"] and second["steps_trained_last_run"] == 1 + 6 and second["invocations"] == 2
    after = {_key(r): r for r in csv.DictReader((out / "seed0" / "maze_sweep.csv").open())}
    for key, row in before.items():
        assert after[key] == row, key  # finished rows untouched (same timings, same invocation)
    merged = list(csv.DictReader((out / "maze_sweep.csv").open()))
    assert len(merged) == 2 * 2 * 2  # seeds x arms x milestones
    assert {int(float(r["invocation"])) for r in merged if int(r["seed"]) == 1} == {2}
    for row in merged:
        assert 0.0 <= float(row["pass_at_1"]) <= float(row["pass_at_8"]) <= 1.0
        assert math.isfinite(float(row["dnll_rare"]))
    seed_rows = [r for r in merged if int(r["seed"]) == 0]
    assert len({r["start_val_pass_at_1"] for r in seed_rows}) == 1  # every arm of a seed starts from one warm start
    # each seed has its own warm start (a tiny test set can give both the same pass@k: compare the weights)
    warm = [load_file(out / f"seed{seed}" / "warm_start" / "model.safetensors") for seed in (0, 1)]
    assert any(not torch.equal(warm[0][name], warm[1][name]) for name in warm[0])
    assert (out / "maze_sweep.png").exists()

    # 3) Interrupted + resumed equals uninterrupted (seed 0 alone, from its saved warm start).
    ref = run_maze_sweep(
        **TINY | {"seeds": [0], "init_from": str(out / "seed0" / "warm_start")}, out_dir=str(tmp_path / "ref")
    )
    for row in ref:
        for column in RESULT[:4]:
            assert float(after[_key(row)][column]) == pytest.approx(float(row[column]), abs=1e-6), (_key(row), column)


def test_bad_settings_exit_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "sweep")
    common = ["--out_dir", out, "--tracking_uri", "none", "--maze_rows", "2", "--maze_cols", "3"]
    assert main([*common, "--arms", "[8-0.5]"]) == 2
    assert "--arms" in capsys.readouterr().err
    assert main([*common, "--ks", "[1, 512]", "--eval_samples", "256"]) == 2
    assert "--ks" in capsys.readouterr().err
    assert main([*common, "--step_budget", "0"]) == EXIT_INCOMPLETE  # writes the settings, trains nothing
    assert main([*common, "--step_budget", "0", "--rl_lr", "5e-4"]) == 2  # would mix two settings in one folder
    assert "--rl_lr" in capsys.readouterr().err
    from lit_fgrpo.cli import main as cli_main

    assert cli_main(["maze-sweep", *common, "--no_such_flag", "1"]) == 2  # the command prints the parser's complaint
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lit-fgrpo maze-sweep: error: unrecognized arguments: --no_such_flag 1", err


def test_combine_merges_csvs(tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "evidence_tiny.csv"
    assert main(["combine", "--csvs", f"[{fixture}, {fixture}]", "--out_dir", str(tmp_path), "--ks", "[1, 8]"]) == 0
    assert len(list(csv.DictReader((tmp_path / "maze_sweep.csv").open()))) == 2 * 40


def _token_ids(tokenizer: Any, tokens: list[str]) -> list[int]:
    return list(tokenizer.convert_tokens_to_ids(tokens))


def _target_pool(model: torch.nn.Module) -> RarePool:
    tokenizer = build_word_tokenizer(list(MAZE_VOCAB))
    mazes = make_maze_splits(MazeConfig(3, 3), num_train=12, num_val=0, num_test=0, seed=1)["train"]
    pairs: list[tuple[list[int], list[int]]] = [
        (_token_ids(tokenizer, maze_prompt_tokens(m)), _token_ids(tokenizer, maze_target_tokens(m)[:-1])) for m in mazes
    ]
    input_ids, attn, comp = pack_pool(pairs, tokenizer.pad_token_id)
    pool = RarePool(input_ids, attn, comp, torch.zeros(len(pairs)), num_sampled=len(pairs))
    pool.base_nll = score_nll(model, pool)
    return pool


def test_dnll_rare_is_zero_for_the_base_policy() -> None:
    torch.manual_seed(0)
    model = build_tiny_policy(len(MAZE_VOCAB), TinyPolicyConfig(hidden_size=32, intermediate_size=64))
    pool = _target_pool(model)
    rare, mean = pool.delta(model, top_fraction=0.25)
    assert rare == 0.0 and mean == 0.0
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rare, mean = pool.delta(moved, top_fraction=0.25)
    assert math.isfinite(rare) and rare != 0.0


@pytest.mark.slow
def test_method_arms_at_a_token_budget_and_their_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lit_fgrpo.experiments.methods_report import main as compare_main

    settings = TINY | {"arms": ["4:0", "4:0:band", "4:0:dynamic", "4:0:async"], "seeds": [0], "milestones": [], "rl_steps": 30,
                       "token_budget": 120}  # fmt: skip
    out = tmp_path / "methods"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = run_maze_sweep(**settings, out_dir=str(out))
        assert torch.get_num_threads() == 2  # the sweep's num_threads=1 held for its run only
    finally:
        torch.set_num_threads(threads)
    by_method = {r["method"]: r for r in rows}
    assert sorted(by_method) == ["async", "band", "dynamic", "focal"]
    for row in rows:  # every arm generated (about) the budget, whatever its step count
        assert 120 <= int(row["generated_tokens"]) < 120 + 4 * 4 * 7 * 4 and int(row["trained_steps"]) < 30
    assert int(by_method["dynamic"]["trained_steps"]) < int(by_method["focal"]["trained_steps"])
    assert (out / "seed0" / "N4_g0_dynamic" / "last.ckpt").exists()
    assert run_maze_sweep(**settings, out_dir=str(out)) == rows  # a rerun finds every arm done
    assert compare_main([str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "| GRPO N=4 | 1 |" in text and "| band (0.1, 0.9) N=4 | 1 |" in text and "| dynamic sampling N=4 | 1 |" in text
    )
    assert (out / "methods_report.md").exists() and (out / "methods_pass_at_k.png").exists()
