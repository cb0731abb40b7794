"""Paired statistics of the pre-registered maze test (docs/RESULTS.md §6.4): t intervals, bootstrap, MDE, verdicts.

Pure functions over per-seed values; Student's t quantiles come from the exact closed-form CDF for integer degrees
of freedom (Abramowitz & Stegun 26.7.3-4) inverted by bisection, so no SciPy is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Classification = Literal["gain", "no meaningful gain", "open"]
Verdict = Literal["supported", "not supported", "undecided at this power", "undecided (interim)"]

MIN_SEEDS = 3
"""Fewer finished seeds than this: every hypothesis is "undecided (interim)" (pre-registered)."""
FINAL_SEEDS = 5
"""The verdict is final only with this many seeds."""


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` >= 1 (exact finite series)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:  # A&S 26.7.3
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        central = 2.0 / math.pi * (theta + s * total)
    else:  # A&S 26.7.4
        term, total = 1.0, 1.0
        for k in range(2, df - 1, 2):
            term *= (k - 1) / k * c * c
            total += term
        central = s * total
    return 0.5 + math.copysign(central / 2.0, t)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`, 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Paired:
    """Summary of per-seed paired differences d_s = A_s - B_s."""

    n: int
    mean: float
    sd: float
    low: float
    """Lower end of the two-sided 95 % t interval."""
    high: float
    boot_low: float
    """2.5 % percentile of the seed bootstrap of the mean."""
    boot_high: float
    mde: float
    """Minimal detectable effect at 80 % power, two-sided alpha 0.05: (t(.975) + t(.80)) * sd / sqrt(n)."""


def paired(differences: Sequence[float], resamples: int = 10_000, seed: int = 0) -> Paired:
    """t interval, seed bootstrap and MDE of the mean of ``differences`` (NaN intervals below 2 values)."""
    d = np.asarray(differences, dtype=np.float64)  # (n,)
    n = int(d.size)
    if n == 0:
        nan = float("nan")
        return Paired(0, nan, nan, nan, nan, nan, nan, nan)
    mean = float(d.mean())
    if n < 2:
        nan = float("nan")
        return Paired(1, mean, nan, nan, nan, nan, nan, nan)
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    half = t_quantile(0.975, n - 1) * se
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, n, size=(resamples, n))].mean(axis=1)  # (resamples,)
    mde = (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * se
    return Paired(n, mean, sd, mean - half, mean + half, float(np.quantile(means, 0.025)),
                  float(np.quantile(means, 0.975)), mde)  # fmt: skip


def classify_gain(p: Paired, delta: float) -> Classification:
    """§6.4: "gain" if the 95 % CI lies above 0; "no meaningful gain" if not and its upper end is below delta."""
    if p.n < 2 or math.isnan(p.low):
        return "open"
    if p.low > 0:
        return "gain"
    return "no meaningful gain" if p.high < delta else "open"


def h1_verdict(pass1: Paired, pass256: Paired, delta: float) -> Verdict:
    """H1: supported if both metrics gain, not supported if either shows no meaningful gain, else undecided."""
    if min(pass1.n, pass256.n) < MIN_SEEDS:
        return "undecided (interim)"
    kinds = {classify_gain(pass1, delta), classify_gain(pass256, delta)}
    if kinds == {"gain"}:
        return "supported"
    if "no meaningful gain" in kinds:
        return "not supported"
    return "undecided at this power"


def noninferiority_verdict(p: Paired, delta: float) -> Verdict:
    """H2: supported if the CI's lower end is above -delta, not supported if its upper end is below -delta."""
    if p.n < MIN_SEEDS:
        return "undecided (interim)"
    if p.low > -delta:
        return "supported"
    if p.high < -delta:
        return "not supported"
    return "undecided at this power"
