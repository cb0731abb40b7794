"""Held-out pass@k against k (log-scaled x), before and after RL: the question every run answers."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_NAME = re.compile(r"^(?:.*/)?pass_at_(\d+)$")


def pass_at_k_from_metrics(metrics: dict[str, float]) -> dict[int, float]:
    """``{"pass_at_1": 0.2, "val/pass_at_8": 0.6}`` -> ``{1: 0.2, 8: 0.6}``; other keys are ignored."""
    out: dict[int, float] = {}
    for name, value in metrics.items():
        match = _NAME.match(name)
        if match:
            out[int(match.group(1))] = float(value)
    return out


def pass_at_k_figure(before: dict[int, float], after: dict[int, float], title: str = "held-out pass@k") -> Figure:
    """Two curves of pass@k over k on a log2 x axis, annotated with the after - before change at each k.

    Args:
        before: k -> pass@k of the policy RL started from (may be empty).
        after: k -> pass@k at the end of RL (may be empty).
        title: the axes title.

    Returns:
        A matplotlib Figure (Agg; nothing is shown). F-GRPO's claim reads off it: pass@1 up without pass@k at
        large k going down.
    """
    if not before and not after:
        raise ValueError("pass_at_k_figure needs pass@k values before or after RL, got neither")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 4.0), dpi=110)
    ax = figure.add_subplot()
    for label, values, style in (("before RL", before, "o--"), ("after RL", after, "o-")):
        if values:
            ks = sorted(values)
            ax.plot(ks, [values[k] for k in ks], style, label=label)
    for k in sorted(set(before) & set(after)):
        delta = after[k] - before[k]
        ax.annotate(f"{delta:+.3f}", (k, after[k]), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ks = sorted(set(before) | set(after))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    figure.tight_layout()
    return figure
