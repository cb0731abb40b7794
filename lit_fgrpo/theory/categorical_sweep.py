"""A grid of categorical simulations (group sizes x gammas x seeds) run in parallel, aggregated over seeds.

Each run is one :func:`~lit_fgrpo.theory.simulation.simulate_categorical` call reduced to its final metrics
(``Q_pos``, ``M_ret``, entropy); :func:`sweep_categorical` runs the grid in this process or in ``spawn`` worker
processes and :func:`aggregate_runs` gives one row per (N, gamma) with the mean, the sample std and every seed's
value. ``lit-fgrpo simulate`` (:mod:`lit_fgrpo.commands.simulate`) writes them as a CSV and a figure.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from lit_fgrpo.theory.simulation import simulate_categorical


def _run_final(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Worker: one run, final metrics only (picklable)."""
    result = simulate_categorical(**kwargs, record_every=max(1, int(kwargs.get("steps", 1000))))
    return {
        "group_size": result.group_size,
        "gamma": result.gamma,
        "seed": result.seed,
        "q_pos": result.final_q_pos,
        "m_ret": result.final_m_ret,
        "entropy": result.final_entropy,
    }


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (0 for a single value)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate_runs(runs: Sequence[dict[str, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Group per-seed final metrics into one row per (N, gamma): mean, sample std and per-seed columns.

    Args:
        runs: Dicts with keys group_size, gamma, seed, q_pos, m_ret, entropy.
        seeds: The seeds, fixing the order of the per-seed columns.

    Returns:
        Rows sorted by (gamma, N) with keys group_size, gamma, num_seeds, {metric}_mean, {metric}_std and
        {metric}_seed{s} for metric in q_pos, m_ret, entropy.
    """
    grouped: dict[tuple[float, int], dict[int, dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["gamma"], run["group_size"]), {})[run["seed"]] = run
    rows: list[dict[str, Any]] = []
    for (gamma, n), by_seed in sorted(grouped.items()):
        row: dict[str, Any] = {"group_size": n, "gamma": gamma, "num_seeds": len(by_seed)}
        for metric in ("q_pos", "m_ret", "entropy"):
            values = [by_seed[s][metric] for s in seeds if s in by_seed]
            row[f"{metric}_mean"] = statistics.fmean(values)
            row[f"{metric}_std"] = _std(values)
        for metric in ("q_pos", "m_ret", "entropy"):
            for s in seeds:
                row[f"{metric}_seed{s}"] = by_seed[s][metric] if s in by_seed else math.nan
        rows.append(row)
    return rows


def sweep_categorical(
    group_sizes: Iterable[int],
    gammas: Iterable[float],
    seeds: int | Iterable[int],
    workers: int = 1,
    verbose: bool = False,
    **kw: Any,
) -> list[dict[str, Any]]:
    """Final Q_pos / M_ret over a grid of group sizes x gammas x seeds.

    Args:
        group_sizes: Values of N.
        gammas: Focal exponents.
        seeds: A seed count (``range(seeds)``) or explicit seeds.
        workers: Processes to use (1 runs in this process). More than 1 uses ``spawn`` processes, so a calling
            script needs the usual ``if __name__ == "__main__":`` guard.
        verbose: Print one line per finished run to stderr.
        **kw: Passed to :func:`simulate_categorical` (steps, lr, surrogate, weight_decay, num_actions, ...).

    Returns:
        One row per (N, gamma), see :func:`aggregate_runs`.
    """
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    gamma_list = [float(g) for g in gammas]
    kw.pop("record_every", None)
    jobs = [
        {"group_size": n, "gamma": g, "seed": s, **kw}
        for n in sorted({int(n) for n in group_sizes}, reverse=True)  # largest N first balances the workers
        for g in gamma_list
        for s in seed_list
    ]
    runs: list[dict[str, Any]] = []
    if workers <= 1:
        for job in jobs:
            runs.append(_run_final(job))
            _report(runs[-1], len(runs), len(jobs), verbose)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for run in pool.map(_run_final, jobs):
                runs.append(run)
                _report(run, len(runs), len(jobs), verbose)
    return aggregate_runs(runs, seed_list)


def _report(run: dict[str, Any], done: int, total: int, verbose: bool) -> None:
    """Print one progress line to stderr when verbose."""
    if verbose:
        print(
            f"[{done}/{total}] N={run['group_size']} gamma={run['gamma']:g} seed={run['seed']} "
            f"Q_pos={run['q_pos']:.4f} M_ret={run['m_ret']:.4f}",
            file=sys.stderr,
            flush=True,
        )
