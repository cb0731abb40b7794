"""Lemma 3.1 against its sum form, a Monte Carlo check, the paper's table and large-N stability."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_fgrpo.theory import tail_miss_probability


def sum_form(n: int, mu: float, tau: float) -> float:
    return sum(math.comb(n, k) * (mu - tau) ** k * (1 - mu) ** (n - k) for k in range(1, n))


@pytest.mark.parametrize(("mu", "tau"), [(0.5, 0.05), (0.8, 0.008), (0.2, 0.04), (0.63, 6.3e-5)])
def test_matches_binomial_sum(mu: float, tau: float) -> None:
    for n in (1, 2, 3, 8, 32, 100):
        assert tail_miss_probability(n, mu, tau) == pytest.approx(sum_form(n, mu, tau), abs=1e-12)


def test_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    mu, tau, n, groups = 0.5, 0.05, 8, 200_000
    # regions: 0 = rare correct subset E, 1 = other correct, 2 = incorrect
    draws = rng.choice(3, size=(groups, n), p=[tau, mu - tau, 1 - mu])
    correct = (draws < 2).sum(1)
    active = (correct > 0) & (correct < n)
    miss = active & ~(draws == 0).any(1)
    assert miss.mean() == pytest.approx(float(tail_miss_probability(n, mu, tau)), abs=0.005)


def test_paper_values_and_large_n_stability() -> None:
    n = np.array([2, 8, 1024, 8192, 2**15, 2**16, 2**17, 2**20])
    got = tail_miss_probability(n, 0.630, 6.3e-5)
    np.testing.assert_allclose(got[:6], [0.466, 0.974, 0.94, 0.60, 0.127, 0.016], atol=0.005)
    assert 1e-4 < got[6] < 1e-3 and 0 <= got[7] < 1e-20 and np.isfinite(got).all()
    table = {(0.8, 0.01, 8): 0.783, (0.5, 0.05, 32): 0.445, (0.2, 0.05, 128): 0.276}
    for (mu, rho, size), want in table.items():
        assert tail_miss_probability(size, mu, rho * mu) == pytest.approx(want, abs=1e-3)


def test_torch_and_numpy_agree_elementwise() -> None:
    n = torch.tensor([1.0, 4.0, 16.0, 131072.0])
    mu = torch.tensor([0.5, 0.8, 0.2, 0.63])
    tau = mu * 0.05
    out = tail_miss_probability(n, mu, tau)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), tail_miss_probability(n.numpy(), mu.numpy(), tau.numpy()), rtol=1e-12)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="rare_mass"):
        tail_miss_probability(8, 0.3, 0.5)
    with pytest.raises(ValueError, match="success_mass"):
        tail_miss_probability(8, 1.3, 0.1)
