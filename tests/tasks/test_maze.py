"""Maze task: Prim's perfect mazes, prompt layout, exact-path checker, splits, tokenizer, tiny policy, warm start."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from lit_fgrpo.experiments.warm_start import evaluate_pass_at_k, warm_start
from lit_fgrpo.tasks.maze import (
    MAZE_VOCAB,
    MOVES,
    Maze,
    MazeConfig,
    check_maze_completion,
    generate_maze,
    make_maze_splits,
    maze_prompt_tokens,
    maze_target_tokens,
    parse_prompt,
)
from lit_fgrpo.tasks.tiny_policy import TinyPolicyConfig, build_tiny_policy
from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

CONFIGS = [MazeConfig(3, 3), MazeConfig(4, 4), MazeConfig(2, 5, newline_tokens=False), MazeConfig(5, 5, False, False)]


def _open_moves(maze: Maze, cell: tuple[int, int]) -> list[tuple[int, int]]:
    r, c = cell
    return [(r + dr, c + dc) for dr, dc in MOVES.values() if maze.grid[2 * r + 1 + dr][2 * c + 1 + dc] != "WALL"]


def _count_simple_paths(maze: Maze) -> int:
    def dfs(cell: tuple[int, int], seen: set[tuple[int, int]]) -> int:
        if cell == maze.goal:
            return 1
        return sum(dfs(nxt, seen | {nxt}) for nxt in _open_moves(maze, cell) if nxt not in seen)

    return dfs(maze.start, {maze.start})


@pytest.mark.parametrize("config", CONFIGS[:3])
def test_prim_mazes_are_perfect(config: MazeConfig) -> None:
    rng = random.Random(0)
    cells = config.rows * config.cols
    for _ in range(30):
        maze = generate_maze(config, rng)
        assert maze.start != maze.goal
        passages = sum(len(_open_moves(maze, (r, c))) for r in range(config.rows) for c in range(config.cols)) // 2
        assert passages == cells - 1
        assert _count_simple_paths(maze) == 1
        cell = maze.start  # the solution walks through open passages to the goal
        for move in maze.solution:
            nxt = (cell[0] + MOVES[move][0], cell[1] + MOVES[move][1])
            assert nxt in _open_moves(maze, cell)
            cell = nxt
        assert cell == maze.goal


@pytest.mark.parametrize(("config", "length"), [(MazeConfig(4, 4), 94), (MazeConfig(5, 5), 136), (CONFIGS[3], 85)])
def test_prompt_length_is_fixed(config: MazeConfig, length: int) -> None:
    rng = random.Random(1)
    for _ in range(20):
        maze = generate_maze(config, rng)
        prompt = maze_prompt_tokens(maze)
        assert len(prompt) == length
        assert prompt[:2] == ["<bos>", "GRID_START"] and prompt[-2:] == ["GRID_END", "PATH_START"]
        assert maze_target_tokens(maze)[-2:] == ["DONE", "<eos>"]


def test_checker_accepts_only_the_exact_path() -> None:
    rng = random.Random(2)
    for _ in range(20):
        maze = generate_maze(MazeConfig(4, 4), rng)
        prompt_text = " ".join(maze_prompt_tokens(maze))
        sol = list(maze.solution)
        for completion in ([*sol, "DONE"], [*sol, "DONE", "<eos>"], [*sol, "DONE", "UP", "<pad>"]):
            assert check_maze_completion(maze, completion)
            assert check_maze_completion(prompt_text, " ".join(completion))
        wrong = [sol[:-1] + ["DONE"], [*sol, sol[-1], "DONE"], sol, [*sol, "<eos>"], [*sol, "<pad>", "DONE"], []]
        for i, move in enumerate(sol):
            wrong += [sol[:i] + [other] + sol[i + 1 :] + ["DONE"] for other in MOVES if other != move]
        for completion in wrong:
            assert not check_maze_completion(maze, completion)
            assert not check_maze_completion(prompt_text, completion)


@pytest.mark.parametrize("config", CONFIGS)
def test_parse_prompt_round_trips(config: MazeConfig) -> None:
    rng = random.Random(3)
    for _ in range(10):
        maze = generate_maze(config, rng)
        tokens = maze_prompt_tokens(maze)
        square_or_lines = config.newline_tokens or config.rows == config.cols
        assert parse_prompt(tokens, config) == maze
        if square_or_lines:
            assert parse_prompt(" ".join(tokens)) == maze
            assert parse_prompt(" ".join(tokens[1:])) == maze  # decoded without special tokens
    with pytest.raises(ValueError):
        parse_prompt("GRID_START WALL WALL GRID_END")


def test_splits_are_disjoint_and_deterministic() -> None:
    config = MazeConfig(3, 3)
    splits = make_maze_splits(config, 500, 40, 40, seed=5)
    assert [len(splits[k]) for k in ("train", "val", "test")] == [500, 40, 40]
    keys = {k: {" ".join(maze_prompt_tokens(m)) for m in v} for k, v in splits.items()}
    assert sum(len(v) for v in keys.values()) == 580
    assert not (keys["train"] & keys["test"] or keys["train"] & keys["val"] or keys["val"] & keys["test"])
    assert make_maze_splits(config, 500, 40, 40, seed=5) == splits
    assert make_maze_splits(config, 50, 40, 40, seed=5)["test"] == splits["test"]
    assert make_maze_splits(config, 500, 40, 40, seed=6)["test"] != splits["test"]
    with pytest.raises(ValueError):
        make_maze_splits(MazeConfig(2, 1), 3, 0, 0)  # one tree, two start/goal pairs


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_round_trip_and_reload(arch: str, tmp_path) -> None:
    tok = build_word_tokenizer(MAZE_VOCAB)
    maze = generate_maze(MazeConfig(4, 4), random.Random(4))
    text = " ".join(maze_prompt_tokens(maze) + maze_target_tokens(maze))
    ids = tok(text)["input_ids"]
    assert ids == [MAZE_VOCAB.index(w) for w in text.split()]
    assert tok.decode(ids) == text
    assert tok(" ".join(MAZE_VOCAB))["input_ids"] == list(range(len(MAZE_VOCAB)))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    folder = tmp_path / "tok"
    tok.save_pretrained(folder)
    if arch == "llama":  # a Llama config.json next to it keeps tokenizer.json as written
        build_tiny_policy(
            len(MAZE_VOCAB), TinyPolicyConfig(arch="llama", hidden_size=32, num_layers=1)
        ).save_pretrained(folder)
    reloaded = AutoTokenizer.from_pretrained(folder)
    assert reloaded(text)["input_ids"] == ids
    assert reloaded.decode(ids) == text
    assert reloaded.pad_token_id == 0 and reloaded.eos_token_id == 2


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_policy_forward(arch: str) -> None:
    model = build_tiny_policy(len(MAZE_VOCAB), TinyPolicyConfig(arch=arch))  # type: ignore[arg-type]
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    ids = torch.randint(0, len(MAZE_VOCAB), (2, 20))  # (B, T)
    assert model(input_ids=ids).logits.shape == (2, 20, len(MAZE_VOCAB))
    assert 0.7e6 < sum(p.numel() for p in model.parameters()) < 0.9e6
    paper = TinyPolicyConfig.paper_17x17()
    assert (paper.num_layers, paper.hidden_size, paper.num_kv_heads, paper.rope_theta) == (4, 256, 2, 1e6)


def test_warm_start_lowers_loss_and_evaluates() -> None:
    tok = build_word_tokenizer(MAZE_VOCAB)
    splits = make_maze_splits(MazeConfig(3, 3), 256, 0, 4, seed=0)
    config = TinyPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
    model = build_tiny_policy(len(MAZE_VOCAB), config)
    seen: list[int] = []
    losses = warm_start(
        model, tok, splits["train"], steps=30, batch_size=8, lr=1e-2, log_every=10, callback=lambda s, _: seen.append(s)
    )
    assert len(losses) == 30 and seen == [10, 20, 30]
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert model.training is False  # mode restored
    metrics = evaluate_pass_at_k(model, tok, splits["test"], n=4, ks=[2, 4], chunk=8)
    assert set(metrics) == {"pass_at_1", "pass_at_2", "pass_at_4", "greedy_accuracy"}
    p1, p2, p4 = metrics["pass_at_1"], metrics["pass_at_2"], metrics["pass_at_4"]
    assert -1e-9 <= p1 <= p2 + 1e-9 and p2 <= p4 + 1e-9 and p4 <= 1.0 + 1e-9
    with pytest.raises(ValueError):
        evaluate_pass_at_k(model, tok, splits["test"], n=2, ks=[4])
