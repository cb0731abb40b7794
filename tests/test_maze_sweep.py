"""The maze sweep end to end on tiny settings, and ΔNLL_rare = 0 for an unchanged policy."""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path
from typing import Any

import torch

from lit_fgrpo.experiments import main, run_maze_sweep
from lit_fgrpo.experiments.rare_pool import RarePool, pack_pool, score_nll
from lit_fgrpo.tasks import MazeConfig, TinyPolicyConfig, build_tiny_policy, build_word_tokenizer, make_maze_splits
from lit_fgrpo.tasks.maze import MAZE_VOCAB, maze_prompt_tokens, maze_target_tokens

TINY_MODEL = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 160,
    "tie_word_embeddings": True,
}
TINY: dict[str, Any] = dict(
    group_sizes=(4,), gammas=(0.0, 1.0), rl_steps=2, prompts_per_step=4, warm_start_steps=60, eval_samples=8,
    ks=(1, 8), maze_rows=2, maze_cols=3, num_train=200, num_val=8, num_test=8, val_samples=4, dnll_prompts=16,
    dnll_samples=16, dnll_top_fraction=0.25, warm_start_lr=3e-3, model_config=TINY_MODEL, tracking_uri=None,
)  # fmt: skip


def test_tiny_sweep_writes_table_with_shared_warm_start(tmp_path: Path) -> None:
    rows = run_maze_sweep(out_dir=tmp_path, seed=0, **TINY)
    assert [(r["group_size"], r["gamma"]) for r in rows] == [(4, 0.0), (4, 1.0)]
    with (tmp_path / "maze_sweep.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == 2
    for column in ("group_size", "gamma", "pass_at_1", "pass_at_8", "base_pass_at_1", "base_pass_at_8",
                   "start_val_pass_at_1", "dnll_rare", "dnll_mean", "dnll_pool_size", "rl_seconds", "seed"):  # fmt: skip
        assert column in table[0], column
    # Same warm start for every arm: identical pre-RL validation pass@k (same weights, same sampling seeds).
    assert table[0]["start_val_pass_at_1"] == table[1]["start_val_pass_at_1"]
    assert table[0]["base_pass_at_1"] == table[1]["base_pass_at_1"]
    assert int(table[0]["dnll_pool_size"]) > 0
    for row in rows:
        assert math.isfinite(row["dnll_rare"]) and math.isfinite(row["dnll_mean"])
        assert 0.0 <= row["pass_at_1"] <= row["pass_at_8"] <= 1.0
    assert (tmp_path / "maze_sweep.png").exists()
    assert (tmp_path / "warm_start" / "config.json").exists()
    # A second process can reuse the saved warm start: same base metrics, same pre-RL check, same first arm.
    again = run_maze_sweep(
        out_dir=tmp_path / "again", seed=0, init_from=tmp_path / "warm_start", **TINY | {"gammas": (0.0,)}
    )  # type: ignore[arg-type]
    for key in ("base_pass_at_1", "base_pass_at_8", "start_val_pass_at_1", "pass_at_1", "dnll_rare"):
        assert again[0][key] == rows[0][key], key
    merged = main(["--combine", str(tmp_path / "maze_sweep.csv"), str(tmp_path / "again" / "maze_sweep.csv"),
                   "--ks", "1", "8", "--out-dir", str(tmp_path / "merged")])  # fmt: skip
    assert merged == 0 and len(list(csv.DictReader((tmp_path / "merged" / "maze_sweep.csv").open()))) == 3


def test_cli_main_parses_and_runs(tmp_path: Path) -> None:
    argv = ["--group-sizes", "2", "--gammas", "0.5", "--rl-steps", "1", "--prompts-per-step", "2",
            "--warm-start-steps", "2", "--eval-samples", "2", "--ks", "1", "2", "--maze-rows", "2", "--maze-cols",
            "2", "--num-train", "20", "--num-val", "2", "--num-test", "2", "--val-samples", "2", "--dnll-prompts",
            "2", "--dnll-samples", "2", "--tracking-uri", "none", "--out-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "maze_sweep.csv").exists()


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
