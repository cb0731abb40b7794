"""Tasks: the maze of the paper's §6 (Prim's perfect mazes, word-level tokens, exact-path judge) and arithmetic, and
the registry through which the core finds a task by name (:mod:`lit_fgrpo.tasks.registry`).

Importing this package registers the built-in tasks (:mod:`lit_fgrpo.tasks.builtin`), the maze first (the default).
"""

from lit_fgrpo.tasks.builtin import register_builtin_tasks
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
from lit_fgrpo.tasks.registry import (
    Task,
    TaskPrompt,
    default_task,
    get_task,
    load_tokenizer,
    register_task,
    registered_tasks,
    task_names,
    unregister_task,
)
from lit_fgrpo.tasks.tiny_policy import TinyPolicyConfig, build_tiny_policy
from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

register_builtin_tasks()

__all__ = [
    "MAZE_VOCAB",
    "Maze",
    "MazeConfig",
    "Task",
    "TaskPrompt",
    "TinyPolicyConfig",
    "build_tiny_policy",
    "build_word_tokenizer",
    "check_maze_completion",
    "default_task",
    "generate_maze",
    "get_task",
    "load_tokenizer",
    "make_maze_splits",
    "maze_prompt_tokens",
    "maze_target_tokens",
    "parse_prompt",
    "register_task",
    "registered_tasks",
    "task_names",
    "unregister_task",
]
