"""The method comparison report: its numbers equal the textbook formulas on a hand-made CSV."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from lit_fgrpo.experiments.evidence_stats import t_quantile
from lit_fgrpo.experiments.methods_report import arm_label, compare, main
from lit_fgrpo.experiments.sweep_report import write_csv

PASS1 = {("focal", 0.0): [0.30, 0.35, 0.28], ("focal", 0.5): [0.33, 0.36, 0.33], ("maxrl", 0.0): [0.25, 0.31, 0.20],
         ("async", 0.5): [0.34, 0.33, 0.30]}  # fmt: skip


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for (method, gamma), values in PASS1.items():
        for seed, value in enumerate(values, start=1):
            out.append({"seed": seed, "group_size": 8, "gamma": gamma, "method": method, "rl_steps": 300,
                        "trained_steps": 100, "generated_tokens": 64_000 + seed, "pass_at_1": value,
                        "pass_at_64": min(1.0, value + 0.5), "base_pass_at_1": 0.1, "base_pass_at_64": 0.8})  # fmt: skip
    return out


def test_labels() -> None:
    assert arm_label({"method": "focal", "gamma": 0, "group_size": 8}) == "GRPO"
    assert arm_label({"method": "", "gamma": 0.5, "group_size": 8}) == "F-GRPO γ=0.5"  # rows written before methods
    assert arm_label({"method": "dynamic", "gamma": 0, "group_size": 32}) == "dynamic sampling N=32"


def test_table_and_paired_differences_match_the_formulas(tmp_path: Path) -> None:
    for seed in (1, 2, 3):
        write_csv([r for r in rows() if r["seed"] == seed], tmp_path / f"seed{seed}" / "maze_sweep.csv")
    text = compare(str(tmp_path))
    grpo, maxrl = PASS1[("focal", 0.0)], PASS1[("maxrl", 0.0)]
    assert f"| GRPO | 3 | {statistics.mean(grpo):.3f} ± {statistics.stdev(grpo):.3f} |" in text
    d = [a - b for a, b in zip(maxrl, grpo)]
    half = t_quantile(0.975, 2) * statistics.stdev(d) / 3**0.5
    mean = statistics.mean(d)
    assert f"| MaxRL - GRPO | {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] (n=3) |" in text
    # the asynchronous arm is also compared with its synchronous twin (F-GRPO with the same gamma)
    d = [a - b for a, b in zip(PASS1[("async", 0.5)], PASS1[("focal", 0.5)])]
    assert f"| async k=1 + γ=0.5 - F-GRPO γ=0.5 | {statistics.mean(d):+.3f} [" in text
    assert (tmp_path / "methods_pass_at_k.png").stat().st_size > 0


def test_missing_source_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("lit-fgrpo maze-compare: error:")
