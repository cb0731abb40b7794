"""What each run of ``lit-fgrpo compare`` logged while it trained: held-out learning curves and group statistics.

A run started with ``configs/smollm2/csv_metrics.yaml`` writes Lightning's CSV log to
``<run>/metrics/version_0/metrics.csv``: one row per logging call, a ``step`` column and one column per metric. From
it come the held-out curve (``val/pass_at_1`` at each validation step, every seed of an arm: the mean and the seeds'
range, :func:`curve_figure`) and, per run, the training-time statistics the paper's diagnostics ask for: the shares
of all-correct and all-wrong groups (the groups GRPO cannot learn from), the focal weight of the active groups, and
the tokens generated (the sampling cost of a group size). Runs without the file contribute nothing here.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_CSV = Path("metrics") / "version_0" / "metrics.csv"
"""Where a run's CSV log is, relative to its folder (``configs/smollm2/csv_metrics.yaml``)."""
CURVE = "val/pass_at_1"
MEANS = ("rollout/frac_all_correct", "rollout/frac_all_wrong", "rollout/frac_active_groups", "focal/weight_median")
"""Per-step values averaged over a run's steps."""
TOTALS = ("rollout/generated_tokens",)
"""Per-step values summed over a run's steps."""


def read_rows(path: Path) -> list[dict[str, float]]:
    """The CSV log's rows, each ``{column: value}`` with the empty cells left out."""
    with path.open(newline="") as handle:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]


def curve(rows: Iterable[dict[str, float]], key: str = CURVE) -> dict[int, float]:
    """RL steps done -> the last value of ``key`` logged then.

    Lightning's logged ``step`` counts optimizer steps from 0: what is logged after the k-th RL step (its training
    statistics, or a validation run after it) carries step k - 1.
    """
    return {int(row["step"]) + 1: row[key] for row in rows if key in row and "step" in row}


def run_summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """One run's training statistics: the means over steps of :data:`MEANS`, the sums of :data:`TOTALS`, and the
    spread of the per-step focal weight (its 10th and 90th percentile over steps)."""
    out: dict[str, float] = {}
    for key in (*MEANS, *TOTALS):
        values = [row[key] for row in rows if key in row]
        if values:
            out[key] = float(np.sum(values)) if key in TOTALS else float(np.mean(values))
    weights = [row["focal/weight_median"] for row in rows if "focal/weight_median" in row]
    if weights:
        out["focal/weight_median_p10"] = float(np.quantile(weights, 0.1))
        out["focal/weight_median_p90"] = float(np.quantile(weights, 0.9))
    return out


def load_run(folder: Path) -> tuple[dict[int, float], dict[str, float]] | None:
    """The held-out curve and the training statistics of the run in ``folder`` (None without a CSV log)."""
    path = folder / METRICS_CSV
    if not path.is_file():
        return None
    rows = read_rows(path)
    return curve(rows), run_summary(rows)


def band(curves: list[dict[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps that every curve has, with the mean, minimum and maximum over the curves at each."""
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    values = [[c[s] for c in curves] for s in steps]
    return steps, [float(np.mean(v)) for v in values], [min(v) for v in values], [max(v) for v in values]


def curve_figure(curves: dict[str, list[dict[int, float]]], start: float | None = None) -> Figure:
    """Held-out pass@1 against RL steps per arm: the mean of the seeds validated at every step, in their range, and
    the other seeds' values (validated less often, e.g. only at the end) as dots.

    Args:
        curves: arm -> one ``{step: pass@1}`` per seed.
        start: the base model's held-out pass@1, drawn at step 0 for every arm (None: not drawn).
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=120)
    axes = figure.subplots()
    for index, (arm, per_seed) in enumerate(curves.items()):
        if not per_seed:
            continue
        shift = 0.15 * (index - (len(curves) - 1) / 2)  # the arms' dots side by side, not on top of each other
        longest = max(len(c) for c in per_seed)
        full = [c for c in per_seed if len(c) == longest]
        others = [c for c in per_seed if len(c) < longest]
        steps, mean, low, high = band(full)
        if start is not None and not math.isnan(start):
            steps, mean, low, high = [0, *steps], [start, *mean], [start, *low], [start, *high]
        label = f"{arm}: mean of {len(full)} seeds, band their range"
        (line,) = axes.plot(steps, mean, marker="o", label=label + (f"; dots {len(others)} more" if others else ""))
        axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        for other in others:
            axes.scatter([x + shift for x in other], list(other.values()), color=line.get_color(), s=14, alpha=0.6)
    axes.set_xlabel("RL step")
    axes.set_ylabel("held-out pass@1")
    axes.set_title("held-out pass@1 over RL steps")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=7)
    figure.tight_layout()
    return figure


def training_table(summaries: dict[str, list[dict[str, float]]]) -> list[str]:
    """Markdown rows of the per-arm training statistics: each a mean over the arm's runs (their range after it)."""
    columns = [
        ("rollout/generated_tokens", "tokens generated a run", "{:,.0f}"),
        ("rollout/frac_all_correct", "all-correct groups", "{:.3f}"),
        ("rollout/frac_all_wrong", "all-wrong groups", "{:.3f}"),
        ("rollout/frac_active_groups", "groups trained", "{:.3f}"),
        ("focal/weight_median", "focal weight (median of a step)", "{:.3f}"),
    ]
    lines = [
        "| arm | runs | " + " | ".join(title for _, title, _ in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for arm, runs in summaries.items():
        cells = []
        for key, _, fmt in columns:
            values = [run[key] for run in runs if key in run]
            if not values:
                cells.append("-")
                continue
            cell = fmt.format(float(np.mean(values)))
            if len(values) > 1:
                cell += f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
            cells.append(cell)
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def rare_nll_lines(path: Path) -> list[str]:
    """The ΔNLL_rare section of the report from ``lit-fgrpo rare-nll``'s file (nothing when there is none)."""
    import json

    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    pool = data["pool"]
    lines = ["", f"dNLL_rare (`lit-fgrpo rare-nll`): the base model's {pool['correct']} correct replies of "
             f"{pool['sampled']} sampled on the training questions; the {pool.get('rare', '')} it found least likely "
             f"(top {pool['top_fraction']:.0%} by NLL): their mean NLL increase under each run's policy "
             "(positive: mass moved away from them).", "",
             "| arm or comparison | runs | mean [95 % t CI] |", "|---|---|---|"]  # fmt: skip
    for name, p in [*data["summary"].items(), *data["tests"].items()]:
        ci = f"{p['mean']:+.3f}" if p["n"] < 2 else f"{p['mean']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}]"
        lines.append(f"| {name} | {p['n']} | {ci if p['n'] else '-'} |")
    return lines
