"""Single-solution mazes (paper §6): Prim's perfect mazes, word-level prompts, exact-path checker.

A maze of ``R x C`` cells is drawn as a ``(2R+1) x (2C+1)`` token grid: cell ``(r, c)`` sits at grid position
``(2r+1, 2c+1)``, the positions between two cells are ``WALL`` or an open ``PATH``, and the outer border is all
``WALL``. One move (``UP``/``DOWN``/``LEFT``/``RIGHT``) goes from one cell to the next. Prim's algorithm gives a
spanning tree of the cells, so exactly one simple path joins start and goal, and reward 1 means "wrote that path".
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.settings_mapping import check_int

MAZE_VOCAB: list[str] = [
    "<pad>", "<bos>", "<eos>", "<unk>", "GRID_START", "GRID_END", "PATH_START", "DONE", "PATH", "WALL",
    "GOAL", "START", "NEWLINE", "UP", "DOWN", "LEFT", "RIGHT",
]  # fmt: skip
"""The word-level vocabulary; a token's id is its index here."""

MOVES: dict[str, tuple[int, int]] = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
"""Cell offset ``(d_row, d_col)`` of each move token."""

_STOP_TOKENS = ("DONE", "<eos>")
_CELL_TOKENS = ("PATH", "START", "GOAL")

Cell = tuple[int, int]


@dataclass(frozen=True)
class MazeConfig:
    """Size and prompt layout of a maze family: the ``maze`` task's settings (``--data.maze.rows 5``)."""

    rows: int = 4
    """Maze cell rows ``R`` (the token grid has ``2R+1`` rows)."""
    cols: int = 4
    """Maze cell columns ``C`` (the token grid has ``2C+1`` columns)."""
    newline_tokens: bool = True
    """End every prompt row with a ``NEWLINE`` token."""
    border_walls: bool = True
    """Write the outer wall border in the prompt (dropping it shortens a 5x5 prompt from 136 to 85 tokens)."""

    def __post_init__(self) -> None:
        flag = "--data.maze"
        check_int(f"{flag}.rows", self.rows, 1)
        check_int(f"{flag}.cols", self.cols, 1)
        if self.rows * self.cols < 2:
            raise ConfigError(f"{flag}.rows x cols must give at least two cells (a start and a goal), got 1x1")
        for name in ("newline_tokens", "border_walls"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{flag}.{name}: expected true or false, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Maze:
    """One maze with its start, goal and unique solution."""

    config: MazeConfig
    """Size and prompt layout."""
    grid: tuple[tuple[str, ...], ...]
    """Full ``(2R+1) x (2C+1)`` token grid, border included, with ``START`` and ``GOAL`` marked."""
    start: Cell
    """Start cell ``(row, col)`` in cell coordinates."""
    goal: Cell
    """Goal cell ``(row, col)`` in cell coordinates, distinct from ``start``."""
    solution: tuple[str, ...] = field(default=())
    """Moves of the unique path from start to goal."""


def _neighbours(grid: Sequence[Sequence[str]], cell: Cell) -> list[tuple[str, Cell]]:
    """Moves open from ``cell`` and the cells they lead to."""
    r, c = cell
    out = []
    for move, (dr, dc) in MOVES.items():
        if grid[2 * r + 1 + dr][2 * c + 1 + dc] != "WALL":
            out.append((move, (r + dr, c + dc)))
    return out


def solve(grid: Sequence[Sequence[str]], start: Cell, goal: Cell) -> tuple[str, ...]:
    """Breadth-first search for the move sequence from ``start`` to ``goal``.

    Raises:
        ValueError: If the goal cannot be reached.
    """
    parent: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for move, nxt in _neighbours(grid, cell):
            if nxt not in parent:
                parent[nxt] = (cell, move)
                queue.append(nxt)
    if goal not in parent:
        raise ValueError("goal is not reachable from start")
    moves: list[str] = []
    step = parent[goal]
    while step is not None:
        moves.append(step[1])
        step = parent[step[0]]
    return tuple(reversed(moves))


def generate_maze(config: MazeConfig, rng: random.Random) -> Maze:
    """Draw a perfect maze with randomized Prim's algorithm and random distinct start and goal cells.

    Args:
        config: Maze size and layout.
        rng: Source of randomness; the maze is a deterministic function of its state.

    Returns:
        The maze with its unique solution.
    """
    rows, cols = config.rows, config.cols
    grid = [["WALL"] * (2 * cols + 1) for _ in range(2 * rows + 1)]
    first = (rng.randrange(rows), rng.randrange(cols))
    visited = {first}
    grid[2 * first[0] + 1][2 * first[1] + 1] = "PATH"
    frontier: list[tuple[Cell, Cell]] = []  # (cell in maze, cell outside)

    def add_frontier(cell: Cell) -> None:
        for dr, dc in MOVES.values():
            nr, nc = cell[0] + dr, cell[1] + dc
            if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) not in visited:
                frontier.append((cell, (nr, nc)))

    add_frontier(first)
    while frontier:
        i = rng.randrange(len(frontier))
        frontier[i], frontier[-1] = frontier[-1], frontier[i]
        inside, outside = frontier.pop()
        if outside in visited:
            continue
        visited.add(outside)
        grid[inside[0] + outside[0] + 1][inside[1] + outside[1] + 1] = "PATH"  # the wall between them
        grid[2 * outside[0] + 1][2 * outside[1] + 1] = "PATH"
        add_frontier(outside)

    start_idx, goal_idx = rng.sample(range(rows * cols), 2)
    start, goal = divmod(start_idx, cols), divmod(goal_idx, cols)
    grid[2 * start[0] + 1][2 * start[1] + 1] = "START"
    grid[2 * goal[0] + 1][2 * goal[1] + 1] = "GOAL"
    frozen = tuple(tuple(row) for row in grid)
    return Maze(config=config, grid=frozen, start=start, goal=goal, solution=solve(frozen, start, goal))


def maze_prompt_tokens(maze: Maze) -> list[str]:
    """Prompt tokens: ``<bos> GRID_START`` + grid rows (+ ``NEWLINE``) + ``GRID_END PATH_START``."""
    rows = maze.grid if maze.config.border_walls else [row[1:-1] for row in maze.grid[1:-1]]
    tokens = ["<bos>", "GRID_START"]
    for row in rows:
        tokens.extend(row)
        if maze.config.newline_tokens:
            tokens.append("NEWLINE")
    tokens += ["GRID_END", "PATH_START"]
    return tokens


def maze_target_tokens(maze: Maze) -> list[str]:
    """Target tokens: the solution moves, then ``DONE <eos>``."""
    return [*maze.solution, "DONE", "<eos>"]


def _as_tokens(text_or_tokens: str | Sequence[str]) -> list[str]:
    return text_or_tokens.split() if isinstance(text_or_tokens, str) else list(text_or_tokens)


@lru_cache(maxsize=65536)
def _parse_cached(tokens: tuple[str, ...], config: MazeConfig | None) -> Maze:
    try:
        body = list(tokens[tokens.index("GRID_START") + 1 : tokens.index("GRID_END")])
    except ValueError as err:
        raise ValueError("prompt lacks GRID_START ... GRID_END") from err
    newline_tokens = "NEWLINE" in body
    if newline_tokens:
        rows = [list(r.split()) for r in " ".join(body).split("NEWLINE") if r.strip()]
    else:
        if config is not None:
            width = 2 * config.cols + (1 if config.border_walls else -1)
        else:  # assume a square grid
            width = round(len(body) ** 0.5)
        if width < 1 or len(body) % width:
            raise ValueError(f"cannot split {len(body)} grid tokens into rows of {width}")
        rows = [body[i : i + width] for i in range(0, len(body), width)]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("grid rows have unequal lengths")
    border_walls = rows[0][0] == "WALL"  # without a border, position (0, 0) is a cell, never WALL
    if not border_walls:
        rows = [["WALL"] * (len(rows[0]) + 2)] + [["WALL", *r, "WALL"] for r in rows] + [["WALL"] * (len(rows[0]) + 2)]
    if len(rows) % 2 == 0 or len(rows[0]) % 2 == 0:
        raise ValueError(f"grid of {len(rows)}x{len(rows[0])} is not (2R+1)x(2C+1)")
    n_rows, n_cols = len(rows) // 2, len(rows[0]) // 2
    found: dict[str, list[Cell]] = {"START": [], "GOAL": []}
    for r in range(n_rows):
        for c in range(n_cols):
            token = rows[2 * r + 1][2 * c + 1]
            if token not in _CELL_TOKENS:
                raise ValueError(f"cell ({r}, {c}) holds {token!r}")
            if token in found:
                found[token].append((r, c))
    if len(found["START"]) != 1 or len(found["GOAL"]) != 1:
        raise ValueError("need exactly one START and one GOAL")
    grid = tuple(tuple(r) for r in rows)
    start, goal = found["START"][0], found["GOAL"][0]
    cfg = MazeConfig(rows=n_rows, cols=n_cols, newline_tokens=newline_tokens, border_walls=border_walls)
    return Maze(config=cfg, grid=grid, start=start, goal=goal, solution=solve(grid, start, goal))


def parse_prompt(prompt: str | Sequence[str], config: MazeConfig | None = None) -> Maze:
    """Rebuild a maze (and its solution) from its prompt text or tokens.

    Tokens outside ``GRID_START ... GRID_END`` are ignored, so a prompt decoded without special tokens works too.

    Args:
        prompt: Prompt as whitespace-separated text or a token list.
        config: Needed only for non-square grids written without ``NEWLINE`` tokens (its ``cols`` and
            ``border_walls`` fix the row width); otherwise the layout is read from the prompt.

    Raises:
        ValueError: If the prompt is not a well-formed maze.
    """
    return _parse_cached(tuple(_as_tokens(prompt)), config)


def check_maze_completion(maze_or_prompt: Maze | str | Sequence[str], completion: str | Sequence[str]) -> bool:
    """Exact-path judge: True iff the completion is the solution followed by ``DONE``.

    The completion is read up to its first ``DONE`` or ``<eos>``; anything after ``DONE`` is ignored. Stopping at
    ``<eos>`` without ``DONE``, a missing stop token, or any other token before the stop (``<pad>`` included)
    gives False.

    Args:
        maze_or_prompt: The maze, or its prompt as text or tokens.
        completion: The generated tokens, as whitespace-separated text or a token list.
    """
    maze = maze_or_prompt if isinstance(maze_or_prompt, Maze) else parse_prompt(maze_or_prompt)
    tokens = _as_tokens(completion)
    n = len(maze.solution)
    return len(tokens) > n and tokens[n] == "DONE" and tuple(tokens[:n]) == maze.solution


def make_maze_splits(
    config: MazeConfig, num_train: int, num_val: int, num_test: int, seed: int = 0
) -> dict[str, list[Maze]]:
    """Draw train/val/test mazes, all distinct by prompt string, deterministically per seed.

    The test set is drawn first, then validation, then training, so a split does not change when a later
    split's size does.

    Raises:
        ValueError: If the maze family is too small for that many distinct mazes.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    total = num_train + num_val + num_test
    attempts_left = 20 * total + 1000
    splits: dict[str, list[Maze]] = {}
    for name, size in (("test", num_test), ("val", num_val), ("train", num_train)):
        mazes: list[Maze] = []
        while len(mazes) < size:
            if attempts_left == 0:
                raise ValueError(f"could not draw {total} distinct {config.rows}x{config.cols} mazes")
            attempts_left -= 1
            maze = generate_maze(config, rng)
            key = " ".join(maze_prompt_tokens(maze))
            if key not in seen:
                seen.add(key)
                mazes.append(maze)
        splits[name] = mazes
    return {"train": splits["train"], "val": splits["val"], "test": splits["test"]}
