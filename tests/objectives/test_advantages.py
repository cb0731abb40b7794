"""group_advantages / focal_weight against a per-group Python loop, plus invariants."""

from __future__ import annotations

import math

import pytest
import torch

from lit_fgrpo.objectives import focal_weight, group_advantages


def reference_advantages(rewards, gamma, scale, success, eps):
    """Dumb loop over groups in pure Python floats (the spec, restated)."""
    P, G = len(rewards), len(rewards[0])
    flat_valid = [r for row in rewards for r in row if not math.isnan(r)]
    if len(flat_valid) > 1:
        m = sum(flat_valid) / len(flat_valid)
        batch_std = math.sqrt(sum((r - m) ** 2 for r in flat_valid) / (len(flat_valid) - 1))
    else:
        batch_std = 0.0
    out = [[0.0] * G for _ in range(P)]
    for p in range(P):
        idx = [i for i in range(G) if not math.isnan(rewards[p][i])]
        vals = [rewards[p][i] for i in idx]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        div = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        ok = [success[p][i] if success is not None else rewards[p][i] > 0 for i in idx]
        mu = sum(ok) / len(idx)
        g = 1.0 if gamma == 0 else (1 - mu) ** gamma
        for i in idx:
            out[p][i] = g * (rewards[p][i] - mean) / div
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_loop_reference(seed: int, scale: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    P, G = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(2, 17, (1,), generator=gen))
    kind = seed % 3
    if kind == 0:  # binary
        rewards = (torch.rand(P, G, generator=gen) < torch.rand(P, 1, generator=gen)).double()
    elif kind == 1:  # continuous with a shaping term
        rewards = torch.randn(P, G, generator=gen, dtype=torch.float64)
    else:  # binary with NaNs and constant groups
        rewards = (torch.rand(P, G, generator=gen) < 0.5).double()
        rewards[0] = 1.0
        rewards[torch.rand(P, G, generator=gen) < 0.2] = float("nan")
    success = (torch.rand(P, G, generator=gen) < 0.5) if seed % 2 else None
    for gamma in (0.0, 0.5, 1.0, 2.0):
        got = group_advantages(rewards, gamma=gamma, scale=scale, success=success, eps=1e-6)
        want = reference_advantages(
            rewards.tolist(), gamma, scale, success.tolist() if success is not None else None, 1e-6
        )
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_paper_table_values_at_n8() -> None:
    """paper.md §4.3: binary rewards, N = 8, Bessel std, eps 1e-6."""
    table = {1: (0.935, 0.875, 2.475, -0.354), 2: (0.866, 0.75, 1.620, -0.540), 4: (0.707, 0.5, 0.935, -0.935)}
    table |= {6: (0.5, 0.25, 0.540, -1.620), 7: (0.354, 0.125, 0.354, -2.475)}
    for x, (g05, g1, a_pos, a_neg) in table.items():
        rewards = torch.tensor([[1.0] * x + [0.0] * (8 - x)])
        adv = group_advantages(rewards, gamma=0.0)
        assert adv[0, 0].item() == pytest.approx(a_pos, abs=1e-3)
        assert adv[0, -1].item() == pytest.approx(a_neg, abs=1e-3)
        exact = (1 - x / 8) ** 0.5
        assert group_advantages(rewards, gamma=0.5)[0, 0].item() == pytest.approx(exact * adv[0, 0].item(), rel=1e-6)
        assert focal_weight(torch.tensor(x / 8), 0.5).item() == pytest.approx(g05, abs=1e-3)
        assert focal_weight(torch.tensor(x / 8), 1.0).item() == pytest.approx(g1, abs=1e-3)


def test_gamma_zero_is_plain_grpo_bit_for_bit() -> None:
    rewards = torch.rand(16, 8)
    plain = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    torch.testing.assert_close(group_advantages(rewards, gamma=0.0), plain, rtol=1e-6, atol=1e-6)
    assert torch.equal(focal_weight(torch.linspace(0, 1, 11), 0.0), torch.ones(11))


def test_constant_groups_are_exactly_zero() -> None:
    rewards = torch.tensor([[0.1] * 8, [1.0] * 8, [0.0] * 8, [0.3] * 7 + [float("nan")]])
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, gamma=0.5, scale=scale)  # type: ignore[arg-type]
        assert torch.equal(adv, torch.zeros_like(adv))
    # float64 rewards whose group mean is not representable: r - mean is a few ulps, not 0
    inexact = torch.full((2, 7), 0.1, dtype=torch.float64)
    assert (inexact[0] - inexact[0].mean()).abs().max() > 0  # the premise of this check
    for scale in ("group", "batch", "none"):
        adv = group_advantages(inexact, gamma=0.0, scale=scale)  # type: ignore[arg-type]
        assert torch.equal(adv, torch.zeros_like(adv))


def test_nan_rewards_get_zero_and_are_excluded() -> None:
    rewards = torch.tensor([[1.0, 0.0, float("nan"), 1.0]])
    adv = group_advantages(rewards, gamma=0.0)
    assert adv[0, 2].item() == 0.0 and not torch.isnan(adv).any()
    want = group_advantages(torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.0)
    torch.testing.assert_close(adv[0, [0, 1, 3]], want[0])


def test_shift_invariance_when_success_given() -> None:
    rewards = (torch.rand(10, 8) < 0.4).float()
    success = rewards > 0
    base = group_advantages(rewards, gamma=1.0, success=success)
    shifted = group_advantages(rewards * 2.0 - 1.0 + 5.0, gamma=1.0, success=success, scale="group")
    torch.testing.assert_close(base, shifted, rtol=1e-5, atol=1e-5)


def test_focal_weight_falls_as_success_rises() -> None:
    mu = torch.linspace(0, 1, 101)
    for gamma in (0.5, 1.0, 2.0):
        g = focal_weight(mu, gamma)
        assert (g[1:] <= g[:-1]).all() and g[0] == 1 and g[-1] == 0
    # larger gamma never increases the weight
    assert (focal_weight(mu, 2.0) <= focal_weight(mu, 0.5) + 1e-12).all()


def test_dtype_and_detached() -> None:
    rewards = torch.rand(3, 4, requires_grad=True)
    adv = group_advantages(rewards, gamma=0.5)
    assert adv.dtype == torch.float32 and not adv.requires_grad
    assert group_advantages(torch.randint(0, 2, (3, 4)), gamma=0.5).dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": torch.zeros(8)}, "2-D"),
        ({"rewards": torch.zeros(2, 4), "success": torch.zeros(2, 3, dtype=torch.bool)}, "success shape"),
        ({"rewards": torch.zeros(2, 4), "gamma": -1.0}, "gamma"),
        ({"rewards": torch.zeros(2, 4), "eps": 0.0}, "eps"),
        ({"rewards": torch.zeros(2, 4), "scale": "token"}, "scale"),
    ],
)
def test_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(**kwargs)
