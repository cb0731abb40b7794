"""``lit-fgrpo maze-report`` regenerates the verdict from a stored per-seed CSV (tests/fixtures/evidence_tiny.csv).

The fixture's numbers were drawn so that the answer is known: F-GRPO gamma 0.5 beats GRPO-8 by about 0.07 on pass@1
and pass@256 (H1a supported), gamma 1 is within ±0.01 of GRPO-8 (H1b not supported), gamma 0.5 at N = 8 is 0.016
above GRPO-32 on pass@256 (H2 supported), and GRPO-8 ends 0.08 below the warm start on pass@256 (sharpening).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

from lit_fgrpo.cli import main as cli_main
from lit_fgrpo.experiments.evidence_report import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "evidence_tiny.csv"


def _column(arm: tuple[int, float], metric: str, steps: int = 200) -> dict[int, float]:
    rows = csv.DictReader(FIXTURE.open())
    return {int(r["seed"]): float(r[metric]) for r in rows
            if (int(r["group_size"]), float(r["gamma"])) == arm and int(r["rl_steps"]) == steps}  # fmt: skip


def test_report_regenerates_the_verdict_from_the_csv(tmp_path: Path) -> None:
    assert main([str(FIXTURE), "--out_dir", str(tmp_path)]) == 0
    verdict = json.loads((tmp_path / "evidence_verdict.json").read_text())
    assert verdict["seeds"] == [1, 2, 3, 4, 5] and verdict["rl_steps"] == 200
    assert list(verdict["verdicts"].values()) == [
        "supported", "not supported", "supported", "not supported", "sharpening present"
    ]  # fmt: skip
    # The H1a pass@1 interval, recomputed by hand from the CSV.
    a, b = _column((8, 0.5), "pass_at_1"), _column((8, 0.0), "pass_at_1")
    d = [a[s] - b[s] for s in sorted(a)]
    half = 2.776445 * statistics.stdev(d) / math.sqrt(5)
    h1a = verdict["tests"]["H1a: F-GRPO-8 gamma 0.5 - GRPO-8"]["pass_at_1"]
    assert math.isclose(h1a["low"], statistics.mean(d) - half, abs_tol=1e-6)
    text = (tmp_path / "evidence_report.md").read_text()
    assert "**H1a: F-GRPO-8 gamma 0.5 - GRPO-8: supported.**" in text and "detectable effect" in text
    assert (tmp_path / "evidence_pass_at_k.png").stat().st_size > 0


def test_report_of_an_earlier_milestone_and_few_seeds_is_interim(tmp_path: Path) -> None:
    rows = [r for r in csv.DictReader(FIXTURE.open()) if int(r["seed"]) <= 2]
    two = tmp_path / "seed1" / "maze_sweep.csv"  # the sweep's own layout: DIR/seed*/maze_sweep.csv
    two.parent.mkdir()
    with two.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert cli_main(["maze-report", str(tmp_path), "--rl_steps", "100"]) == 0
    verdict = json.loads((tmp_path / "evidence_verdict.json").read_text())
    assert verdict["rl_steps"] == 100 and set(verdict["verdicts"].values()) == {"undecided (interim)"}


def test_missing_source_is_one_line_exit_2(tmp_path: Path) -> None:
    assert main([str(tmp_path / "nothing")]) == 2
