"""The method comparison of a maze sweep: GRPO, F-GRPO, MaxRL, band, dynamic sampling, GSPO side by side.

    lit-fgrpo maze-compare outputs/methods            # reads DIR/seed*/maze_sweep.csv, writes methods_report.md/.png

Per arm: held-out pass@1 and pass@64 (and every other pass@k in the CSV) as mean ± standard deviation over seeds,
the per-seed values, what the arm generated (completion tokens) and how many steps it took for that; per method,
the paired per-seed difference to GRPO with its 95 % t interval (:func:`~lit_fgrpo.experiments.evidence_stats.paired`).
This comparison is descriptive: it has no pre-registered decision rule (docs/RESULTS.md §6 is the one that has).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lit_fgrpo.commands.cli_errors import subcommand_error
from lit_fgrpo.errors import DataError
from lit_fgrpo.experiments.evidence_report import base_by_seed, load_rows, plot_arms, report_dir
from lit_fgrpo.experiments.evidence_stats import paired
from lit_fgrpo.experiments.sweep_report import row_method

LABELS = {
    "maxrl": "MaxRL",
    "band": "band (0.1, 0.9)",
    "dynamic": "dynamic sampling",
    "gspo": "GSPO",
    "async": "async k=1",
}
BASELINE = "GRPO"


def arm_label(row: dict[str, Any]) -> str:
    """``GRPO``, ``F-GRPO γ=0.5``, ``MaxRL``, ... (with ``N=`` when the group size is not 8)."""
    method, gamma = row_method(row), float(row["gamma"])
    if method == "focal":
        label = BASELINE if gamma == 0 else f"F-GRPO γ={gamma:g}"
    else:
        label = LABELS.get(method, method) + ("" if gamma == 0 else f" + γ={gamma:g}")
    return label if int(row["group_size"]) == 8 else f"{label} N={int(row['group_size'])}"


def by_arm(rows: Sequence[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Rows keyed by arm label, then by seed (first-seen arm order)."""
    arms: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        arms.setdefault(arm_label(row), {})[int(row["seed"])] = row
    return arms


def _sync_twins(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Label of each asynchronous arm -> label of the synchronous arm with the same N and gamma."""
    twins = {}
    for row in rows:
        if row_method(row) == "async":
            twins[arm_label(row)] = arm_label(dict(row) | {"method": "focal"})
    return twins


def _ks(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted(int(key.removeprefix("pass_at_")) for key in rows[0] if key.startswith("pass_at_"))


def check_columns(rows: Sequence[dict[str, Any]], source: str) -> None:
    """Every row has each ``pass_at_k`` and its ``base_pass_at_k`` as a number (the table and figure read them all).

    Raises:
        DataError: naming ``source``, the column and the seed.
    """
    for k in _ks(rows):
        for column in (f"pass_at_{k}", f"base_pass_at_{k}"):
            bad = next((row for row in rows if not isinstance(row.get(column), int | float)), None)
            if bad is not None:
                raise DataError(f"{source}: column {column} is missing or empty in a row of seed {bad['seed']}")


def render(rows: Sequence[dict[str, Any]], steps: int, source: str) -> str:
    """The markdown report: per-arm table and the paired differences to GRPO."""
    arms = by_arm(rows)
    every_k = _ks(rows)
    ks = sorted({every_k[0], 64 if 64 in every_k else every_k[-1]})  # pass@1 and pass@64 (the two)

    def cell(values: list[float]) -> str:
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
        return f"{np.mean(values):.3f} ± {sd:.3f}" if not math.isnan(sd) else f"{np.mean(values):.3f}"

    lines = [
        f"# Method comparison on the maze ({source}, cap {steps} RL steps)",
        "",
        "mean ± standard deviation over seeds; tokens = completion tokens generated (all rounds), steps = RL steps.",
        "",
        "| arm | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " | tokens (mean) | steps (mean) |",
        "|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    base = {int(r["seed"]): r for r in rows}  # one warm start per seed (every arm's row repeats it)
    base_cells = [cell([float(r[f"base_pass_at_{k}"]) for r in base.values()]) for k in ks]
    lines.append(f"| warm start | {len(base)} | " + " | ".join(base_cells) + " | | |")
    for name, per_seed in arms.items():
        values = [cell([float(r[f"pass_at_{k}"]) for r in per_seed.values()]) for k in ks]
        tokens = np.mean([float(r.get("generated_tokens") or "nan") for r in per_seed.values()])
        trained = np.mean([float(r.get("trained_steps") or r["rl_steps"]) for r in per_seed.values()])
        lines.append(f"| {name} | {len(per_seed)} | " + " | ".join(values) + f" | {tokens:,.0f} | {trained:.0f} |")
    # each arm against GRPO; an asynchronous arm also against its synchronous twin (same N and gamma)
    pairs = [(name, BASELINE) for name in arms if name != BASELINE and BASELINE in arms]
    pairs += [(name, twin) for name, twin in _sync_twins(rows).items() if twin in arms]
    if pairs:
        lines += ["", "Paired per-seed differences (mean, 95 % t interval, seeds in common):", ""]
        lines += ["| arm - reference | " + " | ".join(f"Δ pass@{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, reference in pairs:
        common = sorted(set(arms[name]) & set(arms[reference]))
        cells = []
        for k in ks:
            key = f"pass_at_{k}"
            p = paired([float(arms[name][s][key]) - float(arms[reference][s][key]) for s in common])
            cells.append(f"{p.mean:+.3f} [{p.low:+.3f}, {p.high:+.3f}] (n={p.n})")
        lines.append(f"| {name} - {reference} | " + " | ".join(cells) + " |")
    per_seed_rows = ", ".join(
        f"{name}: " + " ".join(f"s{seed}={float(r['pass_at_1']):.3f}" for seed, r in sorted(per_seed.items()))
        for name, per_seed in arms.items()
    )
    lines += ["", f"pass@1 per seed: {per_seed_rows}.", ""]
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Two panels: pass@k against k (log2 axis, mean over seeds with 95 % t bands, the warm start dashed), and each
    arm's paired per-seed difference to GRPO at each k with its 95 % t interval (:func:`plot_arms`). Returns the PNG
    path, or None without matplotlib."""
    arms = {"warm start": base_by_seed(rows)} | by_arm(rows)
    return plot_arms(arms, _ks(rows), path, "held-out pass@k (mean over seeds)",
                     title="maze: methods at equal generated tokens", baseline=BASELINE)  # fmt: skip


def compare(source: str, out_dir: str | None = None, rl_steps: int | None = None) -> str:
    """Write ``methods_report.md`` and ``methods_pass_at_k.png`` for the sweep ``source``; return the markdown.

    Args:
        source: A ``maze-sweep`` output directory (reads ``seed*/maze_sweep.csv``) or one CSV file.
        out_dir: Where the files go (default: ``source`` itself, or the CSV's folder).
        rl_steps: The milestone to compare (default: the largest in the data).
    """
    rows, steps = load_rows(source, rl_steps, required=("pass_at_1", "base_pass_at_1"))
    check_columns(rows, source)
    out = report_dir(source, out_dir)
    text = render(rows, steps, source)
    (out / "methods_report.md").write_text(text)
    plot(rows, out / "methods_pass_at_k.png")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``lit-fgrpo maze-compare SOURCE [--out_dir DIR] [--rl_steps N]``: print the comparison, write its files."""
    from jsonargparse import CLI

    words = list(sys.argv[1:] if argv is None else argv)
    try:
        text = CLI(compare, args=words, exit_on_error=False)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(subcommand_error("maze-compare", err), file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    from lit_fgrpo.commands.cli_errors import run_as_script

    raise SystemExit(run_as_script("maze-compare", main))
