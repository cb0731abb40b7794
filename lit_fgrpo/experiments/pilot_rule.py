"""The pre-registered pilot rule (docs/RESULTS.md §6.5): the RL step count R of the main maze sweep.

R is the smallest evaluated milestone at which GRPO's test pass@256 is at least ``drop`` below the warm start and
its pass@1 is above it (mean over the pilot's seeds); None when no milestone qualifies.

    python -m lit_fgrpo.experiments.pilot_rule /work/evidence_runs/pilot    # prints R, or "none"
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.experiments.sweep_report import read_csv

DROP = 0.04
"""The pass@256 drop below the warm start that counts as visible sharpening (§6.5)."""


def choose_rl_steps(
    rows: Sequence[dict[str, Any]], drop: float = DROP, arm: tuple[int, float] = (8, 0.0)
) -> int | None:
    """The smallest milestone where ``arm`` (default GRPO-8) sharpened visibly; None if there is none."""
    chosen = [r for r in rows if (int(r["group_size"]), float(r["gamma"])) == arm]
    for steps in sorted({int(r["rl_steps"]) for r in chosen}):
        at = [r for r in chosen if int(r["rl_steps"]) == steps]
        fall = sum(float(r["base_pass_at_256"]) - float(r["pass_at_256"]) for r in at) / len(at)
        rise = sum(float(r["pass_at_1"]) - float(r["base_pass_at_1"]) for r in at) / len(at)
        if fall >= drop and rise > 0:
            return steps
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Print the chosen R for the pilot directory (or CSV) given, or ``none``; exit 2 when it has no rows."""
    words = list(sys.argv[1:] if argv is None else argv)
    if len(words) != 1:
        print("usage: python -m lit_fgrpo.experiments.pilot_rule PILOT_DIR_OR_CSV", file=sys.stderr)
        return 2
    path = Path(words[0])
    files = sorted(path.glob("seed*/maze_sweep.csv")) if path.is_dir() else [path]
    rows = [row for f in files if f.exists() for row in read_csv(f)]
    if not rows:
        print(f"pilot_rule: error: {path} has no seed*/maze_sweep.csv rows", file=sys.stderr)
        return 2
    steps = choose_rl_steps(rows)
    print("none" if steps is None else steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
