"""The pilot rule of docs/RESULTS.md §6.5 on hand-made rows and through its command."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from lit_fgrpo.experiments.pilot_rule import choose_rl_steps, main


def _row(steps: int, p1: float, p256: float, gamma: float = 0.0) -> dict[str, Any]:
    return {"group_size": 8, "gamma": gamma, "rl_steps": steps, "pass_at_1": p1, "pass_at_256": p256,
            "base_pass_at_1": 0.18, "base_pass_at_256": 0.90, "seed": 100}  # fmt: skip


def test_smallest_milestone_with_visible_sharpening() -> None:
    rows = [_row(100, 0.25, 0.88), _row(200, 0.30, 0.85), _row(300, 0.33, 0.80), _row(100, 0.3, 0.5, gamma=0.5)]
    assert choose_rl_steps(rows) == 200  # 100: only 0.02 below; the gamma 0.5 row is not the pilot arm
    assert choose_rl_steps([_row(100, 0.10, 0.70)]) is None  # fell, but pass@1 fell too: a collapse, not sharpening
    assert choose_rl_steps([_row(100, 0.25, 0.89)]) is None


def test_command_prints_the_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "seed100" / "maze_sweep.csv"
    path.parent.mkdir()
    rows = [_row(100, 0.25, 0.88), _row(200, 0.30, 0.85)]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main([str(tmp_path)]) == 0 and capsys.readouterr().out.strip() == "200"
    assert main([str(tmp_path / "empty")]) == 2
