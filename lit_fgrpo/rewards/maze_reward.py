"""Exact-path reward for the maze task (paper §6)."""

from __future__ import annotations

from typing import Any

from lit_fgrpo.tasks.maze import check_maze_completion


def maze_reward(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """1.0 exactly when the completion is the maze's unique path followed by ``DONE``, else 0.0.

    The maze is rebuilt from the prompt text (words outside ``GRID_START ... GRID_END``, such as a system prompt,
    are ignored), so no column is needed.

    Raises:
        ValueError: If a prompt is not a well-formed maze (that row then scores ``None`` in ``score_completions``).
    """
    return [float(check_maze_completion(prompt, completion)) for prompt, completion in zip(prompts, completions)]
