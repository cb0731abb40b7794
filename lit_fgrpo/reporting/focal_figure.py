"""The per-group success rate mu_hat over training and the focal weight g = (1 - mu_hat)^gamma it implies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


WeightOfMu = Callable[[np.ndarray], np.ndarray]
"""A group weight as a function of the success rates of the active groups (the group-weight hook's value)."""


def _weights(mu: np.ndarray, gamma: float | WeightOfMu) -> np.ndarray:
    return np.asarray(gamma(mu), dtype=float) if callable(gamma) else (1.0 - mu) ** gamma


def focal_weight_summary(
    success_rates: Sequence[np.ndarray], gamma: float | WeightOfMu
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: mean focal weight over the active groups (0 < mu_hat < 1) and the fraction of active groups.

    Groups with mu_hat in {0, 1} have a zero advantage, so their weight does not act; a step without an active
    group has mean weight NaN.
    """
    weights, active = [], []
    for mu in success_rates:
        mu = np.asarray(mu, dtype=float)
        mu = mu[~np.isnan(mu)]
        live = (mu > 0) & (mu < 1)
        weights.append(float(np.mean(_weights(mu[live], gamma))) if live.any() else float("nan"))
        active.append(float(live.mean()) if mu.size else float("nan"))
    return np.asarray(weights), np.asarray(active)


def success_histogram(success_rates: Sequence[np.ndarray], bins: int = 10) -> np.ndarray:
    """(bins, S) fraction of the groups of each step whose mu_hat falls in each of ``bins`` equal bins of [0, 1]."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    columns = []
    for mu in success_rates:
        mu = np.asarray(mu, dtype=float)
        mu = mu[~np.isnan(mu)]
        counts, _ = np.histogram(mu, bins=edges)
        columns.append(counts / max(1, mu.size))
    return np.stack(columns, axis=1) if columns else np.zeros((bins, 0))


def focal_figure(
    steps: Sequence[int],
    success_rates: Sequence[np.ndarray],
    gamma: float | WeightOfMu,
    bins: int = 10,
    weight_label: str | None = None,
) -> Figure:
    """Two panels over training steps: the distribution of per-group success rates, and the focal weight.

    Args:
        steps: the global step of each recorded rollout batch (S values).
        success_rates: per step, the (P,) success rates mu_hat of its prompt groups (NaN = unscorable group).
        gamma: the focal exponent of the run.
        bins: histogram bins over [0, 1].

    Returns:
        A matplotlib Figure: top, a heat map of the fraction of groups per success-rate bin at each step; bottom,
        the mean g = (1 - mu_hat)^gamma of the active groups and the fraction of active groups (0 < mu_hat < 1).
    """
    if len(steps) != len(success_rates) or not steps:
        raise ValueError(f"focal_figure needs one success-rate array per step, got {len(steps)} steps and "
                         f"{len(success_rates)} arrays")  # fmt: skip
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 5.5), dpi=110)
    top, bottom = figure.subplots(2, 1, sharex=True)
    hist = success_histogram(success_rates, bins)  # (bins, S)
    x = np.asarray(steps, dtype=float)
    x_edges = np.append(x, x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1.0))
    mesh = top.pcolormesh(x_edges, np.linspace(0, 1, bins + 1), hist, shading="flat", cmap="viridis")
    figure.colorbar(mesh, ax=top, label="fraction of groups")
    top.set_ylabel("group success rate mu_hat")
    label = weight_label or (f"gamma = {gamma:g}" if not callable(gamma) else "group weight")
    top.set_title(f"success-rate distribution and group weight ({label})")
    weights, active = focal_weight_summary(success_rates, gamma)
    # markers: a step without active groups is NaN and breaks the line, so isolated steps would vanish
    bottom.plot(x, weights, ".-", label="mean focal weight (active groups)")
    bottom.plot(x, active, "--", label="fraction of active groups")
    bottom.set_ylim(0.0, 1.05)
    bottom.set_xlabel("RL step")
    bottom.grid(True, alpha=0.3)
    bottom.legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    return figure
