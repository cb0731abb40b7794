"""The statistics of the pre-registered test against references: SciPy's t, a hand t interval, the decision rule."""

from __future__ import annotations

import math
import statistics

import pytest

from lit_fgrpo.experiments.evidence_stats import (
    classify_gain,
    h1_verdict,
    noninferiority_verdict,
    paired,
    t_cdf,
    t_quantile,
)

# Student's t quantiles from printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
TABLE = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 4): 2.776, (0.975, 9): 2.262, (0.975, 30): 2.042,
         (0.80, 4): 0.941, (0.80, 9): 0.883}  # fmt: skip


def test_t_quantiles_match_the_printed_table() -> None:
    for (p, df), value in TABLE.items():
        assert t_quantile(p, df) == pytest.approx(value, abs=6e-4), (p, df)
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_cdf_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 41):
        for t in (-7.0, -2.0, -0.4, 0.0, 0.3, 1.1, 2.5, 12.0):
            assert t_cdf(t, df) == pytest.approx(float(stats.t.cdf(t, df)), abs=1e-9), (t, df)


def test_paired_interval_equals_the_textbook_formula() -> None:
    d = [0.05, 0.01, 0.04, 0.07, 0.03]
    p = paired(d)
    half = 2.776445 * statistics.stdev(d) / math.sqrt(len(d))
    assert p.mean == pytest.approx(statistics.mean(d))
    assert (p.low, p.high) == pytest.approx((p.mean - half, p.mean + half), abs=1e-6)
    assert p.mde == pytest.approx((2.776445 + 0.940965) * statistics.stdev(d) / math.sqrt(5), abs=1e-5)
    assert min(d) <= p.boot_low <= p.mean <= p.boot_high <= max(d)
    assert math.isnan(paired([0.1]).low) and paired([]).n == 0


def test_decision_rule() -> None:
    gain, flat, wide = (
        paired([0.05, 0.06, 0.04, 0.05, 0.07]),
        paired([0.0, 0.01, -0.01, 0.0, 0.005]),
        paired([-0.2, 0.3, 0.1, -0.1, 0.25]),
    )
    assert (classify_gain(gain, 0.03), classify_gain(flat, 0.03), classify_gain(wide, 0.03)) == (
        "gain",
        "no meaningful gain",
        "open",
    )
    assert h1_verdict(gain, gain, 0.03) == "supported"
    assert h1_verdict(gain, flat, 0.03) == "not supported"
    assert h1_verdict(gain, wide, 0.03) == "undecided at this power"
    assert h1_verdict(paired([0.05, 0.06]), paired([0.05, 0.06]), 0.03) == "undecided (interim)"  # < 3 seeds
    assert noninferiority_verdict(flat, 0.03) == "supported"
    assert noninferiority_verdict(paired([-0.1, -0.09, -0.11, -0.1, -0.12]), 0.03) == "not supported"
    assert noninferiority_verdict(wide, 0.03) == "undecided at this power"
