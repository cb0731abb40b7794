"""Outputs of the maze sweep: the CSV table, the -log(pass@k) vs N figure (paper Fig. 6) and MLflow loggers."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.experiments.sweep_files import SWEEP_COLUMNS, read_table


def row_method(row: dict[str, Any]) -> str:
    """The method of a sweep row; rows written before arms had a method (empty or missing cell) are ``focal``."""
    return str(row.get("method") or "focal")


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write the sweep rows (one per arm) as CSV, atomically; the header is the union of the keys, in first-seen order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with partial.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)  # atomic: readers and other processes never see half a table
    return path


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Read a sweep CSV back: integer cells as ints, other numeric cells as floats, the rest as strings.

    Checked (:func:`~lit_fgrpo.experiments.sweep_files.read_table`): a cut or malformed file names its line.
    """
    return read_table(path, SWEEP_COLUMNS)


def combine(csv_paths: Sequence[str | Path], out_dir: str | Path, ks: Sequence[int]) -> list[dict[str, Any]]:
    """Merge sweep CSVs (e.g. one per process or seed) into ``out_dir/maze_sweep.csv`` and redraw the figure."""
    rows = [row for path in csv_paths for row in read_csv(path)]
    rows.sort(key=lambda r: (r.get("seed", 0), r["group_size"], r["gamma"]))
    write_csv(rows, Path(out_dir) / "maze_sweep.csv")
    plot_neg_log_pass(rows, ks, Path(out_dir) / "maze_sweep.png")
    return rows


def neg_log(p: float) -> float:
    """``-log(p)``, clipped at p = 1e-6 so that a zero pass rate still plots."""
    return -math.log(max(float(p), 1e-6))


def plot_neg_log_pass(rows: Sequence[dict[str, Any]], ks: Sequence[int], path: str | Path) -> Path | None:
    """One panel per k: -log(pass@k) against N (log2 axis), a line per gamma (mean over seeds), base dashed.

    Returns:
        The PNG path, or None when matplotlib is missing.
    """
    try:
        import matplotlib

        if "MPLBACKEND" not in os.environ:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ks = [k for k in ks if rows and f"pass_at_{k}" in rows[0]]
    fig, axes = plt.subplots(1, len(ks), figsize=(3.6 * len(ks), 3.2), squeeze=False)
    rows = [r for r in rows if row_method(r) == "focal"]  # other methods: lit-fgrpo maze-compare
    gammas = sorted({float(r["gamma"]) for r in rows})
    for ax, k in zip(axes[0], ks):
        key = f"pass_at_{k}"
        for gamma in gammas:
            arm = [r for r in rows if float(r["gamma"]) == gamma]
            sizes = sorted({int(r["group_size"]) for r in arm})
            means = [_mean([float(r[key]) for r in arm if int(r["group_size"]) == n]) for n in sizes]
            label = "GRPO" if gamma == 0 else f"F-GRPO γ={gamma:g}"
            ax.plot(sizes, [neg_log(m) for m in means], marker="o", label=label)
        base = _mean([float(r[f"base_{key}"]) for r in rows])
        ax.axhline(neg_log(base), color="gray", linestyle="--", label="warm start")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size N")
        ax.set_title(f"-log pass@{k}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def make_mlflow_logger(tracking_uri: str | None, experiment: str, run_name: str) -> Any:
    """A Lightning MLFlowLogger for one arm, or None when ``tracking_uri`` is None or mlflow is missing."""
    if tracking_uri is None:
        return None
    from lit_fgrpo.reporting.mlflow_logging import mlflow_available

    if not mlflow_available():
        return None
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name=experiment, run_name=run_name, tracking_uri=tracking_uri, log_model=False)


def log_arm(logger: Any, params: dict[str, Any], metrics: dict[str, float], step: int) -> None:
    """Log an arm's settings as params and its results as metrics (``final/...``) to its MLflow run."""
    if logger is None:
        return
    logger.log_hyperparams({k: str(v)[:500] for k, v in params.items()})
    finite = {f"final/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
    logger.log_metrics(finite, step=step)
    logger.finalize("FINISHED")
