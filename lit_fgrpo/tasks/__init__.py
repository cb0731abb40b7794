"""Built-in tasks: the maze of the paper's §6 (Prim's perfect mazes, word-level tokens, exact-path judge)."""

from lit_fgrpo.tasks.maze import (
    MAZE_VOCAB,
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
from lit_fgrpo.tasks.warm_start import evaluate_pass_at_k, warm_start
from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

__all__ = [
    "MAZE_VOCAB",
    "Maze",
    "MazeConfig",
    "TinyPolicyConfig",
    "build_tiny_policy",
    "build_word_tokenizer",
    "check_maze_completion",
    "evaluate_pass_at_k",
    "generate_maze",
    "make_maze_splits",
    "maze_prompt_tokens",
    "maze_target_tokens",
    "parse_prompt",
    "warm_start",
]
