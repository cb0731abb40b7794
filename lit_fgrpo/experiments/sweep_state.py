"""Bookkeeping of a resumable sweep directory: settings check, status files, budgets, pending units.

Every file is written atomically (temporary file + rename), so a killed run never leaves half a JSON behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lit_fgrpo.experiments.sweep_arm import Arm
from lit_fgrpo.experiments.sweep_files import read_state
from lit_fgrpo.experiments.sweep_report import row_method

# Settings that may change between runs of one output directory; every other one must stay as it was.
FREE_SETTINGS = {"seeds", "arms", "group_sizes", "gammas", "step_budget", "time_budget_s", "num_threads",
                 "tracking_uri", "experiment", "out_dir", "eval_chunk", "ckpt_every", "accelerator", "micro_batch_rows"}  # fmt: skip


class Budget:
    """RL steps and seconds left to this run, and the steps it trained."""

    def __init__(self, steps: int | None, seconds: float | None) -> None:
        self.limit, self.trained = steps, 0
        self.deadline = None if seconds is None else time.monotonic() + seconds

    @property
    def steps(self) -> int | None:
        return None if self.limit is None else self.limit - self.trained

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def spent(self) -> bool:
        left, steps = self.seconds_left(), self.steps
        return (steps is not None and steps <= 0) or (left is not None and left <= 0)


def pending_units(rows: list[dict[str, Any]], arms: list[Arm], steps: list[int]) -> list[tuple[Arm, int]]:
    """The (arm, milestone) units of ``arms`` x ``steps`` that have no row in ``rows`` yet."""
    done = {(int(r["group_size"]), float(r["gamma"]), row_method(r), int(r["rl_steps"])) for r in rows}
    return [(a, m) for a in arms for m in steps if (a.group_size, a.gamma, a.method, m) not in done]


def check_or_write_config(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to mix results of different settings in one output directory."""
    fixed = {k: v for k, v in settings.items() if k not in FREE_SETTINGS}
    fixed = json.loads(json.dumps(fixed, default=str))
    path = out / "sweep_config.json"
    if path.exists():
        before = read_json(path)
        # Settings added to the code after the directory was made are not in the file: they are not compared.
        changed = sorted(k for k in before if fixed.get(k) != before[k])
        if changed:
            raise ValueError(f"{path}: --{changed[0]} differs from the earlier run ({before.get(changed[0])!r}); "
                             "use another --out_dir")  # fmt: skip
    else:
        write_json(path, fixed)


def add_seconds(folder: Path, seconds: float) -> float:
    """Add this call's training seconds to the arm's running total (kept beside its checkpoint)."""
    path = folder / "train_seconds.json"
    total = float(read_json(path).get("seconds", 0.0)) + seconds
    write_json(path, {"seconds": total})
    return total


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object at ``path`` (``{}`` when absent); a broken file is a one-line error naming it."""
    return read_state(path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two runs may share a directory
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)  # atomic: a kill never leaves half a file
