"""Command line for the categorical F-GRPO simulation sweep (paper Section 5.1 / Appendix J).

Writes ``DIR/categorical_sweep.csv`` (one row per (N, gamma): mean, std and per-seed final Q_pos / M_ret /
entropy) and ``DIR/categorical_sweep.png`` (Q_pos and M_ret against N on a log2 axis, one line per gamma), and
optionally logs params, metrics and both files to MLflow. Wired as ``lit-fgrpo simulate ...``; also runnable as
``python -m lit_fgrpo.commands.simulate``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.mlflow_logging import check_tracking_uri
from lit_fgrpo.theory.categorical_sweep import sweep_categorical

PAPER_GROUP_SIZES = [2**k for k in range(1, 18)]
"""N = 2, 4, ..., 131,072 (17 values), the paper's sweep."""
CSV_NAME = "categorical_sweep.csv"
PNG_NAME = "categorical_sweep.png"


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises its one-line complaint (the CLI prints it, without the usage block) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message, hint="run `lit-fgrpo simulate --help` for every flag")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``simulate`` command."""
    p = _RaisingParser(
        prog="lit-fgrpo simulate",
        description="Categorical F-GRPO simulation: final Q_pos / M_ret over group sizes N x focal gammas x seeds.",
    )
    p.add_argument("--group-sizes", type=int, nargs="+", default=PAPER_GROUP_SIZES, help="values of N")
    p.add_argument("--gammas", type=float, nargs="+", default=[0.0, 1.0], help="focal exponents")
    p.add_argument("--seeds", type=int, default=4, help="number of seeds (0 .. seeds-1)")
    p.add_argument("--steps", type=int, default=1000, help="optimisation steps per run")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument(
        "--surrogate",
        choices=["ratio", "linear"],
        default="ratio",
        help="ratio: -(g/N) sum r~ p/sg(p) (reading T, reproduces the paper); linear: -(g/N) sum r~ p (reading L)",
    )
    p.add_argument("--num-actions", type=int, default=128_000, help="vocabulary size")
    p.add_argument("--num-correct", type=int, default=10_000, help="number of correct actions")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--out-dir", type=Path, default=Path("outputs/simulation"), help="output directory")
    p.add_argument("--mlflow", action=argparse.BooleanOptionalAction, default=False, help="log to MLflow")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow tracking URI")
    p.add_argument("--experiment", default="categorical-simulation", help="MLflow experiment name")
    p.add_argument(
        "--artifact-location",
        default=None,
        help="artifact root for a new experiment (default: mlartifacts/ beside a sqlite store, else MLflow's default)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    return p


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write the sweep rows as CSV (columns in the order of the first row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """Q_pos and M_ret (mean +- std over seeds) against N on a log2 axis, one line per gamma."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for gamma in sorted({r["gamma"] for r in rows}):
        sub = sorted((r for r in rows if r["gamma"] == gamma), key=lambda r: r["group_size"])
        ns = [r["group_size"] for r in sub]
        for ax, metric in zip(axes, ("q_pos", "m_ret")):
            mean = [r[f"{metric}_mean"] for r in sub]
            std = [r[f"{metric}_std"] for r in sub]
            style = "-o" if gamma == 0 else "--s"
            ax.errorbar(ns, mean, yerr=std, fmt=style, ms=4, capsize=2, label=f"gamma={gamma:g}")
    for ax, label in zip(axes, ("final Q_pos", "final M_ret")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size N")
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def metric_key(metric: str, gamma: float) -> str:
    """MLflow metric name, e.g. ``gamma1/m_ret_mean``; the MLflow step is the group size N."""
    return f"gamma{gamma:g}/{metric}"


def default_artifact_location(tracking_uri: str) -> str | None:
    """``<dir of the database>/mlartifacts`` for a ``sqlite:///`` store (so nothing lands in the cwd), else None."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    db_path = Path(tracking_uri[len(prefix) :])
    return (db_path.resolve().parent / "mlartifacts").as_uri()


def log_to_mlflow(args: argparse.Namespace, rows: Sequence[dict[str, Any]], files: Sequence[Path]) -> str | None:
    """Log params, per-(N, gamma) metrics (step = N) and the output files; return the run id or None without MLflow."""
    try:
        import mlflow
    except ImportError:
        print("mlflow is not installed; skipping MLflow logging", file=sys.stderr)
        return None
    mlflow.set_tracking_uri(args.tracking_uri)
    if mlflow.get_experiment_by_name(args.experiment) is None:
        location = args.artifact_location or default_artifact_location(args.tracking_uri)
        mlflow.create_experiment(args.experiment, artifact_location=location)
    mlflow.set_experiment(args.experiment)
    params = {
        k: (" ".join(map(str, v)) if isinstance(v, list) else str(v))
        for k, v in vars(args).items()
        if k not in ("mlflow", "tracking_uri", "experiment", "artifact_location", "quiet", "out_dir")
    }
    with mlflow.start_run(run_name=f"categorical-{args.surrogate}") as run:
        mlflow.log_params(params)
        for row in rows:
            for metric in ("q_pos_mean", "q_pos_std", "m_ret_mean", "m_ret_std", "entropy_mean"):
                mlflow.log_metric(metric_key(metric, row["gamma"]), float(row[metric]), step=int(row["group_size"]))
        for f in files:
            mlflow.log_artifact(str(f))
        return str(run.info.run_id)


def check_args(args: argparse.Namespace) -> None:
    """Refuse values the simulation cannot run with, naming the flag.

    Raises:
        ConfigError: e.g. ``"--num-correct 200 must be < --num-actions 100"``.
    """
    checks = [
        (args.seeds >= 1, f"--seeds must be >= 1, got {args.seeds}"),
        (args.steps >= 1, f"--steps must be >= 1, got {args.steps}"),
        (args.workers >= 1, f"--workers must be >= 1, got {args.workers}"),
        (all(n >= 2 for n in args.group_sizes), f"--group-sizes must all be >= 2, got {args.group_sizes}"),
        (all(math.isfinite(g) and g >= 0 for g in args.gammas), f"--gammas must be finite and >= 0, got {args.gammas}"),
        (math.isfinite(args.lr) and args.lr > 0, f"--lr must be finite and > 0, got {args.lr}"),
        (math.isfinite(args.weight_decay) and args.weight_decay >= 0, f"--weight-decay must be >= 0, got {args.weight_decay}"),
        (args.num_actions >= 2, f"--num-actions must be >= 2, got {args.num_actions}"),
        (1 <= args.num_correct < args.num_actions,
         f"--num-correct {args.num_correct} must be >= 1 and < --num-actions {args.num_actions}"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if args.mlflow:
        check_tracking_uri(args.tracking_uri, "--tracking-uri")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, write CSV and PNG, optionally log to MLflow. Returns the exit status (2: bad input, raised)."""
    args = build_parser().parse_args(argv)
    check_args(args)
    start = time.time()
    rows = sweep_categorical(
        args.group_sizes,
        args.gammas,
        args.seeds,
        workers=args.workers,
        verbose=not args.quiet,
        steps=args.steps,
        lr=args.lr,
        surrogate=args.surrogate,
        weight_decay=args.weight_decay,
        num_actions=args.num_actions,
        num_correct=args.num_correct,
    )
    out_dir: Path = args.out_dir
    csv_path, png_path = out_dir / CSV_NAME, out_dir / PNG_NAME
    write_csv(rows, csv_path)
    plot_sweep(
        rows, png_path, title=f"surrogate={args.surrogate}, lr={args.lr:g}, {args.steps} steps, {args.seeds} seeds"
    )
    print(f"wrote {csv_path} and {png_path} in {time.time() - start:.1f} s")
    for row in rows:
        print(
            f"N={row['group_size']:>7d} gamma={row['gamma']:g}  Q_pos {row['q_pos_mean']:.3f} +- {row['q_pos_std']:.3f}"
            f"  M_ret {row['m_ret_mean']:.3f} +- {row['m_ret_std']:.3f}"
        )
    if args.mlflow:
        run_id = log_to_mlflow(args, rows, [csv_path, png_path])
        if run_id:
            print(f"mlflow run {run_id} at {args.tracking_uri}")
    return 0


if __name__ == "__main__":
    from lit_fgrpo.commands.cli_errors import run_as_script

    raise SystemExit(run_as_script("simulate", main))
