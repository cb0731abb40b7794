"""The verdict of the pre-registered maze test (docs/RESULTS.md §6), regenerated from the per-seed CSVs alone.

    lit-fgrpo maze-report /work/evidence_runs/main            # reads DIR/seed*/maze_sweep.csv
    python -m lit_fgrpo.experiments.evidence_report tests/fixtures/evidence_tiny.csv --out_dir /tmp/report

Writes ``evidence_report.md`` (arm table with 95 % t intervals over seeds, the paired comparisons with t and
bootstrap intervals and the minimal detectable effect, one paragraph per hypothesis), ``evidence_verdict.json``
(every number of the markdown) and ``evidence_pass_at_k.png`` (pass@k against k, one line per arm, 95 % bands).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lit_fgrpo.commands.cli_errors import subcommand_error
from lit_fgrpo.errors import DataError
from lit_fgrpo.experiments.evidence_stats import (
    FINAL_SEEDS,
    MIN_SEEDS,
    Paired,
    classify_gain,
    h1_verdict,
    noninferiority_verdict,
    paired,
)
from lit_fgrpo.experiments.sweep_files import SWEEP_COLUMNS, read_table
from lit_fgrpo.experiments.sweep_report import row_method

ARMS: dict[str, tuple[int, float]] = {
    "GRPO-8": (8, 0.0),
    "F-GRPO-8 gamma 0.5": (8, 0.5),
    "F-GRPO-8 gamma 1": (8, 1.0),
    "GRPO-32": (32, 0.0),
}
"""The pre-registered arms (§6.2) as (N, gamma)."""
METRICS = ("pass_at_1", "pass_at_8", "pass_at_64", "pass_at_256", "dnll_rare")
KS = (1, 8, 64, 256)
DELTA = 0.03
"""Smallest effect of interest and non-inferiority margin (§6.4)."""


def report_dir(source: str | Path, out_dir: str | None) -> Path:
    """Where a report of ``source`` goes (created): ``out_dir``, else the sweep directory or the CSV's folder."""
    out = Path(out_dir) if out_dir else (Path(source) if Path(source).is_dir() else Path(source).parent)
    out.mkdir(parents=True, exist_ok=True)
    return out


def load_rows(
    source: str | Path, rl_steps: int | None = None, required: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], int]:
    """Rows of a sweep directory (``seed*/maze_sweep.csv``) or one CSV, at ``rl_steps`` (default: the largest).

    Args:
        source: The sweep directory or a CSV file.
        rl_steps: The milestone to keep; one the data does not have is an error that lists those it has.
        required: Columns the caller reads besides the sweep's own (checked per file, naming it).

    Raises:
        FileNotFoundError: no CSV at ``source``.
        DataError: a CSV is empty, cut short or lacks a column; ``rl_steps`` is not in the data.
    """
    path = Path(source)
    files = sorted(path.glob("seed*/maze_sweep.csv")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"{source}: no seed*/maze_sweep.csv (or no such CSV file)")
    rows = [row for f in files for row in read_table(f, (*SWEEP_COLUMNS, *required))]
    if not rows:
        raise DataError(f"{source}: the CSVs hold no rows")
    have = sorted({int(r["rl_steps"]) for r in rows})
    steps = int(rl_steps if rl_steps is not None else have[-1])
    if steps not in have:
        raise DataError(f"--rl_steps {steps}: {source} has no rows at that step (it has {', '.join(map(str, have))})")
    return [r for r in rows if int(r["rl_steps"]) == steps], steps


def _by_seed(rows: Sequence[dict[str, Any]], arm: str) -> dict[int, dict[str, Any]]:
    size, gamma = ARMS[arm]
    return {
        int(r["seed"]): r
        for r in rows
        if int(r["group_size"]) == size and float(r["gamma"]) == gamma and row_method(r) == "focal"
    }


def base_by_seed(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The warm start's metrics per seed, as arm-shaped rows (ΔNLL 0 by definition)."""
    return {int(r["seed"]): {m: r.get(f"base_{m}", 0.0) for m in METRICS} | {"dnll_rare": 0.0} for r in rows}


def compare(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], metric: str) -> Paired:
    """Paired differences A - B of ``metric`` over the seeds both have."""
    seeds = sorted(a.keys() & b.keys())
    return paired([float(a[s][metric]) - float(b[s][metric]) for s in seeds])


def analyse(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every number of the verdict: per-arm summaries, paired comparisons and the hypotheses' verdicts."""
    arms = {name: _by_seed(rows, name) for name in ARMS} | {"warm start": base_by_seed(rows)}
    summary = {
        name: {m: asdict(paired([float(r[m]) for r in per_seed.values()])) for m in METRICS}
        for name, per_seed in arms.items()
    }
    tests: dict[str, dict[str, Paired]] = {
        "H1a: F-GRPO-8 gamma 0.5 - GRPO-8": {m: compare(arms["F-GRPO-8 gamma 0.5"], arms["GRPO-8"], m) for m in METRICS},
        "H1b: F-GRPO-8 gamma 1 - GRPO-8": {m: compare(arms["F-GRPO-8 gamma 1"], arms["GRPO-8"], m) for m in METRICS},
        "H2: F-GRPO-8 gamma 0.5 - GRPO-32": {m: compare(arms["F-GRPO-8 gamma 0.5"], arms["GRPO-32"], m) for m in METRICS},
        "H2 (secondary): F-GRPO-8 gamma 1 - GRPO-32": {
            m: compare(arms["F-GRPO-8 gamma 1"], arms["GRPO-32"], m) for m in METRICS
        },
        "M: GRPO-8 - warm start": {m: compare(arms["GRPO-8"], arms["warm start"], m) for m in METRICS},
    }  # fmt: skip
    keys = list(tests)
    h1a, h1b, h2, h2s, sharp = (tests[k] for k in keys)
    verdicts = {
        keys[0]: h1_verdict(h1a["pass_at_1"], h1a["pass_at_256"], DELTA),
        keys[1]: h1_verdict(h1b["pass_at_1"], h1b["pass_at_256"], DELTA),
        keys[2]: noninferiority_verdict(h2["pass_at_256"], DELTA),
        keys[3]: noninferiority_verdict(h2s["pass_at_256"], DELTA),
        keys[4]: _sharpening(sharp["pass_at_256"]),
    }
    return {
        "seeds": sorted({int(r["seed"]) for r in rows}),
        "summary": summary,
        "tests": {name: {m: asdict(p) for m, p in per.items()} for name, per in tests.items()},
        "classes": {
            name: {m: classify_gain(p, DELTA) if m.startswith("pass") else "–" for m, p in per.items()}
            for name, per in tests.items()
        },
        "verdicts": verdicts,
    }


def _sharpening(p: Paired) -> str:
    if p.n < MIN_SEEDS:
        return "undecided (interim)"
    if p.high < 0:
        return "sharpening present"
    return "sharpening absent" if p.low > 0 else "undecided at this power"


def _cell(s: dict[str, float]) -> str:
    if s["n"] == 0:
        return "–"
    if math.isnan(s["low"]):
        return f"{s['mean']:.3f}"
    return f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]"


def render(result: dict[str, Any], steps: int, source: str) -> str:
    """The markdown report of :func:`analyse`'s result."""
    seeds = result["seeds"]
    final = len(seeds) >= FINAL_SEEDS
    lines = [
        f"Source: `{source}`, RL steps {steps}, seeds {seeds} ({len(seeds)} finished; "
        + ("final" if final else f"interim: the verdict is final at {FINAL_SEEDS} seeds")
        + "). Intervals: two-sided 95 % t over seeds.",
        "",
        "| arm | seeds | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for name, per in result["summary"].items():
        lines.append(f"| {name} | {per['pass_at_1']['n']} | " + " | ".join(_cell(per[m]) for m in METRICS) + " |")
    lines += ["", "| comparison (A - B) | metric | n | mean | 95 % t CI | bootstrap CI | MDE | class |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, per in result["tests"].items():
        for m in METRICS:
            p = per[m]
            ci = "–" if math.isnan(p["low"]) else f"[{p['low']:+.3f}, {p['high']:+.3f}]"
            boot = "–" if math.isnan(p["boot_low"]) else f"[{p['boot_low']:+.3f}, {p['boot_high']:+.3f}]"
            mde = "–" if math.isnan(p["mde"]) else f"{p['mde']:.3f}"
            mean = "–" if math.isnan(p["mean"]) else f"{p['mean']:+.3f}"
            lines.append(f"| {name} | {m} | {p['n']} | {mean} | {ci} | {boot} | {mde} | {result['classes'][name][m]} |")
    lines += ["", "\n\n".join(_paragraph(name, result) for name in result["verdicts"]), ""]
    lines.append(
        "dnll_rare: lower = the arm kept the rarest correct base trajectories likelier (secondary, no class). "
    )
    lines.append(f"No correction for multiple comparisons (§6.4); smallest effect of interest δ = {DELTA}.")
    return "\n".join(lines) + "\n"


def _paragraph(name: str, result: dict[str, Any]) -> str:
    tests, verdict = result["tests"][name], result["verdicts"][name]
    metrics = ("pass_at_256",) if not name.startswith("H1") else ("pass_at_1", "pass_at_256")

    def said(m: str) -> str:
        p = tests[m]
        if math.isnan(p["low"]):
            return f"{m}: {p['n']} paired seed(s), no interval"
        return (f"{m}: {p['mean']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] over {p['n']} seeds, "
                f"detectable effect (80 % power) {p['mde']:.3f}")  # fmt: skip

    return f"**{name}: {verdict}.** " + "; ".join(said(m) for m in metrics) + "."


def plot_pass_at_k(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """pass@k against k and each arm's paired difference to GRPO-8 (see :func:`plot_arms`)."""
    ks = [k for k in KS if rows and f"pass_at_{k}" in rows[0]]
    per_arm = {name: _by_seed(rows, name) for name in ARMS} | {"warm start": base_by_seed(rows)}
    return plot_arms(per_arm, ks, path, "test pass@k", baseline="GRPO-8")


def plot_arms(
    per_arm: dict[str, dict[int, dict[str, Any]]],
    ks: Sequence[int],
    path: Path,
    ylabel: str,
    title: str = "",
    baseline: str | None = None,
) -> Path | None:
    """pass@k against k (log2 axis): a line per arm (mean over its seeds) with a 95 % t band from 2 seeds on;
    the arm named ``warm start`` dashed. With ``baseline``, a second panel: every other arm's paired per-seed
    difference to the baseline at each k with its 95 % t interval (the seed-to-seed spread of the levels dwarfs the
    differences between arms, so the paired differences are what can be read). Returns the PNG path, or None
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    paired_panel = baseline is not None and bool(per_arm.get(baseline))
    fig, axes = plt.subplots(1, 2 if paired_panel else 1, figsize=(11, 4.2) if paired_panel else (5.5, 4),
                             squeeze=False)  # fmt: skip
    ax = axes[0][0]
    for offset, (name, per_seed) in enumerate(per_arm.items()):
        if not per_seed:
            continue
        stats = [paired([float(r[f"pass_at_{k}"]) for r in per_seed.values()]) for k in ks]
        means = np.array([s.mean for s in stats])
        line = ax.plot(ks, means, marker="o", label=f"{name} ({len(per_seed)} seeds)",
                       linestyle="--" if name == "warm start" else "-")  # fmt: skip
        if len(per_seed) >= 2:
            ax.fill_between(ks, [s.low for s in stats], [s.high for s in stats], alpha=0.2, color=line[0].get_color())
        if paired_panel and name != baseline:
            base = per_arm[str(baseline)]
            common = sorted(set(per_seed) & set(base))
            diffs = [paired([float(per_seed[s][f"pass_at_{k}"]) - float(base[s][f"pass_at_{k}"]) for s in common])
                     for k in ks]  # fmt: skip
            x = [k * 2 ** (0.06 * (offset - len(per_arm) / 2)) for k in ks]  # side by side on the log axis
            err = [[d.mean - d.low for d in diffs], [d.high - d.mean for d in diffs]]
            axes[0][1].errorbar(x, [d.mean for d in diffs], yerr=err, marker="o", capsize=3, linestyle="none",
                                color=line[0].get_color(), label=f"{name} ({len(common)} seeds)")  # fmt: skip
    ax.set_ylabel(ylabel)
    if paired_panel:
        right = axes[0][1]
        right.axhline(0.0, color="gray", linewidth=0.8)
        right.set_ylabel(f"minus {baseline}'s, same seed (95 % t interval)")
    for panel in axes[0]:
        panel.set_xscale("log", base=2)
        panel.set_xlabel("k")
        panel.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(source: str, out_dir: str | None = None, rl_steps: int | None = None) -> str:
    """Analyse ``source`` (a sweep directory or a CSV) and write the report files into ``out_dir``.

    Args:
        source: A ``maze-sweep`` output directory (reads ``seed*/maze_sweep.csv``) or one CSV file.
        out_dir: Where the markdown, JSON and PNG go (default: ``source`` itself, or the CSV's folder).
        rl_steps: The milestone to analyse (default: the largest in the data).
    """
    rows, steps = load_rows(source, rl_steps, required=METRICS)
    result = analyse(rows)
    out = report_dir(source, out_dir)
    text = render(result, steps, source)
    (out / "evidence_report.md").write_text(text)
    (out / "evidence_verdict.json").write_text(json.dumps(result | {"rl_steps": steps}, indent=1))
    plot_pass_at_k(rows, out / "evidence_pass_at_k.png")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``lit-fgrpo maze-report SOURCE [--out_dir DIR] [--rl_steps N]``: print the verdict, write its files."""
    from jsonargparse import CLI

    words = list(sys.argv[1:] if argv is None else argv)
    try:
        text = CLI(report, args=words, exit_on_error=False)
    except (ValueError, FileNotFoundError) as err:
        print(subcommand_error("maze-report", err), file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    from lit_fgrpo.commands.cli_errors import run_as_script

    raise SystemExit(run_as_script("maze-report", main))
