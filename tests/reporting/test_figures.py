"""The figures are pure functions of numbers: their drawn data equal the inputs and a loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_fgrpo.callbacks.focal_figure import group_success_rates
from lit_fgrpo.reporting import focal_figure, pass_at_k_figure, pass_at_k_from_metrics
from lit_fgrpo.reporting.focal_figure import focal_weight_summary, success_histogram


def test_pass_at_k_figure_draws_both_curves_on_log_x() -> None:
    before, after = {1: 0.147, 8: 0.5, 64: 0.8, 256: 0.875}, {1: 0.357, 8: 0.62, 64: 0.78, 256: 0.797}
    figure = pass_at_k_figure(before, after)
    ax = figure.axes[0]
    assert ax.get_xscale() == "log"
    lines = {line.get_label(): line for line in ax.get_lines()}
    for label, values in (("before RL", before), ("after RL", after)):
        assert np.asarray(lines[label].get_xdata()).tolist() == sorted(values)
        assert np.asarray(lines[label].get_ydata()).tolist() == [values[k] for k in sorted(values)]
    deltas = {t.get_text() for t in ax.texts}
    assert {f"{after[k] - before[k]:+.3f}" for k in before} == deltas


def test_pass_at_k_figure_needs_values() -> None:
    with pytest.raises(ValueError, match="before or after"):
        pass_at_k_figure({}, {})


def test_pass_at_k_from_metrics_reads_names() -> None:
    metrics = {
        "pass_at_1": 0.2,
        "val/pass_at_8": 0.6,
        "final/pass_at_64": 0.9,
        "final/start_pass_at_1": 0.0,
        "val/reward_mean": 1.0,
    }
    assert pass_at_k_from_metrics(metrics) == {1: 0.2, 8: 0.6, 64: 0.9}


def test_group_success_rates_match_a_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    correct = torch.rand(5, 8, generator=gen) > 0.5  # (P, G)
    rewards = torch.rand(5, 8, generator=gen)  # (P, G)
    rewards[1, :3] = float("nan")
    rewards[4, :] = float("nan")
    got = group_success_rates(correct, rewards)
    for p in range(5):
        scored = [bool(correct[p, g]) for g in range(8) if not torch.isnan(rewards[p, g])]
        expected = sum(scored) / len(scored) if scored else float("nan")
        assert (np.isnan(got[p]) and np.isnan(expected)) or got[p] == pytest.approx(expected)


def test_focal_summary_and_histogram_match_a_loop() -> None:
    rates = [np.array([0.0, 0.25, 0.5, 1.0]), np.array([0.125, 0.125, np.nan]), np.array([1.0, 1.0])]
    gamma = 0.5
    weights, active = focal_weight_summary(rates, gamma)
    assert weights[0] == pytest.approx(((1 - 0.25) ** gamma + (1 - 0.5) ** gamma) / 2)
    assert weights[1] == pytest.approx((1 - 0.125) ** gamma)
    assert np.isnan(weights[2])  # no active group
    assert list(active) == pytest.approx([0.5, 1.0, 0.0])
    hist = success_histogram(rates, bins=4)  # (bins, S)
    assert hist.shape == (4, 3)
    assert list(hist[:, 0]) == pytest.approx([0.25, 0.25, 0.25, 0.25])  # [0, .25) [.25, .5) [.5, .75) [.75, 1]
    assert list(hist[:, 2]) == pytest.approx([0.0, 0.0, 0.0, 1.0])
    assert hist.sum(axis=0) == pytest.approx([1.0, 1.0, 1.0])


def test_focal_figure_draws_the_weight_curve() -> None:
    rates = [np.array([0.25, 0.5]), np.array([0.5, 0.75])]
    figure = focal_figure([1, 2], rates, gamma=1.0)
    weight_line = next(line for ax in figure.axes for line in ax.get_lines())
    assert np.asarray(weight_line.get_ydata()).tolist() == pytest.approx([0.625, 0.375])
    with pytest.raises(ValueError, match="one success-rate array per step"):
        focal_figure([1], rates, gamma=1.0)
