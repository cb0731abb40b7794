"""Categorical F-GRPO simulation: closed-form gradient and AdamW against torch, and the paper's sweep shape.

The reduced sweep uses a 4,000-action vocabulary (312 correct, the paper's ~1/12.8 ratio, same initial logits)
and the paper's 1,000 steps at lr 1e-2 (reading T). Shrinking the vocabulary raises the per-leaf mass
tau ~ 2e-3 (vs 6.3e-5), which moves the concentration zone from N ~ 2^7..2^15 down to N ~ 2^3..2^9; the
calibration run (1 seed) gave final M_ret 0.93 at N=2, 0.07 (gamma=0) / 0.19 (gamma=1) at N=64 and 0.93 / 1.00
at N=2048, with Q_pos above its initial 0.63 everywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from lit_fgrpo.theory.categorical_sweep import sweep_categorical
from lit_fgrpo.theory.simulation import (
    AdamWState,
    adamw_step,
    group_advantage_weights,
    initial_logits,
    retained_positive_mass,
    sample_counts,
    simulate_categorical,
    surrogate_grad,
    surrogate_loss,
)

SMALL_A, SMALL_C = 50, 5
REDUCED: dict[str, Any] = {"num_actions": 4000, "num_correct": 312, "steps": 1000, "lr": 1e-2}


@pytest.mark.parametrize("surrogate", ["ratio", "linear"])
@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_closed_form_gradient_matches_autograd(surrogate: str, gamma: float) -> None:
    gen = torch.Generator().manual_seed(3)
    z = initial_logits(SMALL_A, SMALL_C) + 0.3 * torch.randn(SMALL_A, generator=gen, dtype=torch.float64)  # (A,)
    probs = torch.softmax(z, dim=0)  # (A,)
    n = 16
    actions = torch.multinomial(probs, n, replacement=True, generator=gen)  # (N,)
    rewards = torch.where(actions < SMALL_C, 1.0, -1.0).to(torch.float64)  # (N,)
    advantages = rewards - rewards.mean()  # (N,)
    mu_hat = float((actions < SMALL_C).double().mean())
    assert 0 < mu_hat < 1, "pick a generator seed that gives a mixed group"
    g = (1 - mu_hat) ** gamma

    leaf = z.clone().requires_grad_(True)
    surrogate_loss(leaf, actions, advantages, g / n, surrogate).backward()  # type: ignore[arg-type]

    counts = torch.bincount(actions, minlength=SMALL_A).double()  # (A,)
    c, g_closed = group_advantage_weights(counts, SMALL_C, gamma)
    assert g_closed == pytest.approx(g)
    grad = surrogate_grad(probs, c, g_closed / n, surrogate)  # type: ignore[arg-type]
    assert leaf.grad is not None
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-10, atol=1e-13)
    if surrogate == "ratio":  # REINFORCE gradient: unsampled logits get none
        assert torch.all(grad[counts == 0].abs() < 1e-15)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adamw_step_matches_torch(weight_decay: float) -> None:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(20, dtype=torch.float64, generator=gen).requires_grad_(True)  # (A,)
    mine = ref.detach().clone()  # (A,)
    opt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    state = AdamWState(torch.zeros_like(mine), torch.zeros_like(mine))
    for _ in range(5):
        grad = torch.randn(20, dtype=torch.float64, generator=gen)  # (A,)
        ref.grad = grad.clone()
        opt.step()
        adamw_step(mine, grad, state, lr=1e-2, weight_decay=weight_decay)
    torch.testing.assert_close(mine, ref.detach(), rtol=1e-12, atol=1e-12)


def test_initial_policy_matches_paper() -> None:
    probs = torch.softmax(initial_logits(128_000, 10_000), dim=0)  # (A,)
    assert float(probs[:10_000].sum()) == pytest.approx(0.6301, abs=1e-4)
    assert float(probs[0]) == pytest.approx(4.65e-4, rel=1e-2)
    assert float(probs[1]) == pytest.approx(6.30e-5, rel=1e-2)
    assert retained_positive_mass(probs[:10_000], probs[:10_000]) == 1.0


def test_sample_counts_follow_the_policy() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)  # (A,)
    counts = sample_counts(probs, 200_000, torch.Generator().manual_seed(0))  # (A,)
    assert float(counts.sum()) == 200_000
    torch.testing.assert_close(counts / 200_000, probs, atol=5e-3, rtol=0)


def test_simulation_records_and_is_deterministic() -> None:
    kw = {"num_actions": 300, "num_correct": 20, "steps": 30, "record_every": 10}
    a = simulate_categorical(8, 1.0, seed=1, **kw)  # type: ignore[arg-type]
    b = simulate_categorical(8, 1.0, seed=1, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(a.steps, [0, 10, 20, 30])
    np.testing.assert_array_equal(a.q_pos, b.q_pos)
    assert a.m_ret[0] == 1.0
    assert a.final_q_pos > a.q_pos[0]
    lin = simulate_categorical(8, 1.0, seed=1, surrogate="linear", **kw)  # type: ignore[arg-type]
    assert lin.final_q_pos != a.final_q_pos


def test_reduced_sweep_shows_the_paper_regimes() -> None:
    """Reading T at reduced scale: Q_pos rises everywhere; M_ret is high / collapsed / high; gamma=1 retains more."""
    rows = sweep_categorical([2, 64, 2048], [0.0, 1.0], seeds=2, workers=1, **REDUCED)
    final = {(r["group_size"], r["gamma"]): r for r in rows}
    q0 = float(torch.softmax(initial_logits(4000, 312), dim=0)[:312].sum())
    for row in rows:
        assert row["q_pos_mean"] > q0 + 0.03, row  # Q_pos rises at every N
    for gamma in (0.0, 1.0):
        small, mid, large = (final[(n, gamma)]["m_ret_mean"] for n in (2, 64, 2048))
        assert small > 0.85 and large > 0.85, (small, large)
        assert mid < 0.5 and mid < small - 0.4 and mid < large - 0.4, (small, mid, large)
    # focal weighting retains more mass in the concentration zone, at every seed
    for s in (0, 1):
        assert final[(64, 1.0)][f"m_ret_seed{s}"] > final[(64, 0.0)][f"m_ret_seed{s}"]


@pytest.mark.slow  # two spawned workers each import torch: ~8 s idle, ~30 s on a busy 2-core machine
def test_sweep_rows_and_worker_pool_agree() -> None:
    kw: dict[str, Any] = {"num_actions": 200, "num_correct": 15, "steps": 20}
    serial = sweep_categorical([4, 2], (g for g in [0.0, 1.0]), seeds=[0, 3], workers=1, **kw)
    pooled = sweep_categorical([2, 4], [0.0, 1.0], seeds=[0, 3], workers=2, **kw)
    assert [(r["group_size"], r["gamma"]) for r in serial] == [(2, 0.0), (4, 0.0), (2, 1.0), (4, 1.0)]
    assert serial == pooled
    row = serial[0]
    assert row["num_seeds"] == 2
    assert row["q_pos_mean"] == pytest.approx((row["q_pos_seed0"] + row["q_pos_seed3"]) / 2)
    assert row["m_ret_std"] == pytest.approx(float(np.std([row["m_ret_seed0"], row["m_ret_seed3"]], ddof=1)))
