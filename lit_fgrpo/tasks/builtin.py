"""The built-in tasks as the registry sees them: the maze (the default) and arithmetic.

``lit_fgrpo.tasks`` registers :data:`BUILTIN_TASKS` when it is imported (:func:`register_builtin_tasks`), so ``--data.source maze``,
``--data.maze.rows``, the ``builtin:maze`` tokenizer and the default reward ``maze`` all come from here.
"""

from __future__ import annotations

from typing import Any

from lit_fgrpo.tasks.arithmetic import ArithmeticSettings, make_arithmetic_splits
from lit_fgrpo.tasks.maze import MAZE_VOCAB, MazeConfig, make_maze_splits, maze_prompt_tokens, maze_target_tokens
from lit_fgrpo.tasks.registry import Task, TaskPrompt, register_task
from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer


def maze_prompts(
    config: MazeConfig, num_train: int, num_val: int, num_test: int, seed: int
) -> dict[str, list[TaskPrompt]]:
    """Disjoint train/val/test mazes; the question is the prompt words, ``answer`` the target words."""
    splits = make_maze_splits(config, num_train=num_train, num_val=num_val, num_test=num_test, seed=seed)
    return {
        name: [
            TaskPrompt(" ".join(maze_prompt_tokens(maze)), {"answer": " ".join(maze_target_tokens(maze))})
            for maze in mazes
        ]
        for name, mazes in splits.items()
    }


def maze_tokenizer() -> Any:
    """The maze's word-level tokenizer (``builtin:maze``): one id per word of :data:`MAZE_VOCAB`."""
    return build_word_tokenizer(list(MAZE_VOCAB))


def arithmetic_prompts(
    settings: ArithmeticSettings, num_train: int, num_val: int, num_test: int, seed: int
) -> dict[str, list[TaskPrompt]]:
    """Disjoint train/val/test arithmetic questions; ``answer`` is the integer result as text."""
    splits = make_arithmetic_splits(settings, num_train=num_train, num_val=num_val, num_test=num_test, seed=seed)
    return {
        name: [
            TaskPrompt(
                question.text(settings.instruction),
                {"answer": str(question.answer), "expression": question.expression},
            )
            for question in questions
        ]
        for name, questions in splits.items()
    }


MAZE = Task(
    name="maze",
    settings=MazeConfig,
    splits=maze_prompts,
    reward="maze",
    tokenizer=maze_tokenizer,
    flat_names={
        "maze_rows": "rows",
        "maze_cols": "cols",
        "maze_newline_tokens": "newline_tokens",
        "maze_border_walls": "border_walls",
    },
)
"""The paper's §6 mazes (:mod:`lit_fgrpo.tasks.maze`), judged by the exact-path reward ``maze``."""

ARITHMETIC = Task(name="arithmetic", settings=ArithmeticSettings, splits=arithmetic_prompts, reward="last_number")
"""Sums for a small instruct model (:mod:`lit_fgrpo.tasks.arithmetic`), judged by the reply's last number."""

BUILTIN_TASKS: tuple[Task, ...] = (MAZE, ARITHMETIC)
"""Registered in this order when :mod:`lit_fgrpo.tasks` is imported; the first is the default task."""


def register_builtin_tasks() -> None:
    """Register :data:`BUILTIN_TASKS` (again: idempotent), the maze as the default task."""
    for task in BUILTIN_TASKS:
        register_task(task, default=task is MAZE)
