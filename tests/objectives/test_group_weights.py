"""Group weights (focal, MaxRL, band, custom) against per-group loops written from the published formulas."""

from __future__ import annotations

import math

import pytest
import torch

from lit_fgrpo.objectives import GroupWeight, group_advantages, group_weight_values


def sqrt_of_size(success_rate: torch.Tensor, group_size: torch.Tensor) -> torch.Tensor:
    """A custom weight for the dotted-path hook: sqrt(G) * mu_hat (depends on both inputs)."""
    return group_size.to(torch.float64).sqrt() * success_rate


def negative_weight(success_rate: torch.Tensor, group_size: torch.Tensor) -> torch.Tensor:
    return -torch.ones_like(success_rate)


def wrong_shape(success_rate: torch.Tensor, group_size: torch.Tensor) -> torch.Tensor:
    return torch.ones(1)


def random_binary_groups(seed: int) -> torch.Tensor:
    """(P, G) 0/1 rewards with one all-fail, one all-success, one all-NaN row and scattered NaNs."""
    gen = torch.Generator().manual_seed(seed)
    P, G = int(torch.randint(4, 10, (1,), generator=gen)), int(torch.randint(2, 17, (1,), generator=gen))
    rewards = (torch.rand(P, G, generator=gen) < torch.rand(P, 1, generator=gen)).double()  # (P, G)
    rewards[torch.rand(P, G, generator=gen) < 0.15] = float("nan")
    rewards[0] = 0.0
    rewards[1] = 1.0
    rewards[2] = float("nan")
    return rewards


def reference(rewards: list[list[float]], kind: str, scale: str, eps: float, **params: float) -> torch.Tensor:
    """The spec as a per-group loop in Python floats, each weight written from its source.

    focal: F-GRPO eq. 12, (1 - mu)^gamma. maxrl: prime-rl ``max_rl`` "reward minus group mean, divided by group
    mean when positive" (0 otherwise); with scale="group" the GRPO std scaling comes first. band: ROLL
    ``difficulty_mask``, keep a group iff low < mean score < high. Custom: sqrt(G) * mu.
    """
    out = [[0.0] * len(row) for row in rewards]
    for p, row in enumerate(rewards):
        vals = [r for r in row if not math.isnan(r)]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mean = sum(vals) / len(vals)  # = mu_hat for 0/1 rewards
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        div = std + eps if scale == "group" else 1.0
        if kind == "focal":
            w = (1 - mean) ** params["gamma"] if params["gamma"] else 1.0
        elif kind == "maxrl":
            w = 1.0 / mean if mean > 0 else 0.0
        elif kind == "band":
            w = 1.0 if params["low"] < mean < params["high"] else 0.0
        else:
            w = math.sqrt(len(vals)) * mean
        for i, r in enumerate(row):
            if not math.isnan(r):
                out[p][i] = w * (r - mean) / div
    return torch.tensor(out, dtype=torch.float64)


CASES = [
    ("focal", {"gamma": 0.0}),
    ("focal", {"gamma": 0.5}),
    ("focal", {"gamma": 2.0}),
    ("maxrl", {}),
    ("band", {"low": 0.0, "high": 1.0}),
    ("band", {"low": 0.2, "high": 0.7}),
    ("custom", {}),
]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize(("kind", "params"), CASES)
def test_weight_matches_published_formula(seed: int, scale: str, kind: str, params: dict) -> None:
    rewards = random_binary_groups(seed)
    name = f"{__name__}.sqrt_of_size" if kind == "custom" else kind
    weight = GroupWeight(name, **params)
    got = group_advantages(rewards, scale=scale, group_weight=weight, eps=1e-6)  # type: ignore[arg-type]
    want = reference(rewards.tolist(), kind, scale, 1e-6, **params)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert not torch.isnan(got).any()


def test_maxrl_is_skyrl_mean_normalised_advantage_without_std() -> None:
    """SkyRL's estimator (r - mean) / (mean + 1e-6) with scale='none', up to its 1e-6 (prime-rl has none)."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0] * 4, [1.0] * 4], dtype=torch.float64)
    mean = rewards.mean(1, keepdim=True)
    skyrl = (rewards - mean) / (mean + 1e-6)
    got = group_advantages(rewards, scale="none", group_weight=GroupWeight("maxrl"))
    torch.testing.assert_close(got, skyrl, rtol=1e-5, atol=0.0)
    assert got[0].tolist() == [3.0, -1.0, -1.0, -1.0]  # the rare success gets 1/p - 1
    assert torch.equal(got[2:], torch.zeros(2, 4, dtype=torch.float64))  # no success / all success: 0


@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_focal_spec_is_bit_for_bit_gamma(gamma: float, scale: str) -> None:
    gen = torch.Generator().manual_seed(int(gamma * 100))
    rewards = torch.randn(7, 8, generator=gen)  # shaped float32 rewards, success from a separate verdict
    rewards[0, 3] = float("nan")
    success = torch.rand(7, 8, generator=gen) < 0.4
    for verdict in (success, None):
        plain = group_advantages(rewards, gamma=gamma, scale=scale, success=verdict)  # type: ignore[arg-type]
        hook = group_advantages(
            rewards,
            scale=scale,  # type: ignore[arg-type]
            success=verdict,
            group_weight=GroupWeight("focal", gamma=gamma),
        )
        assert torch.equal(plain, hook)


def test_band_wider_than_one_sample_is_grpo_with_binary_rewards() -> None:
    # With G = 8 binary rewards mu_hat is a multiple of 1/8: the band (0.1, 0.9) keeps every group but the all-fail
    # and all-success ones, whose advantages are 0 anyway, so it trains exactly as GRPO (the maze comparison's band
    # arm equals its GRPO arm to the last digit); (0.2, 0.8) also drops mu_hat = 1/8 and 7/8.
    gen = torch.Generator().manual_seed(0)
    rewards = (torch.rand(64, 8, generator=gen) < torch.rand(64, 1, generator=gen)).float()  # (P, G) mixed rates
    grpo = group_advantages(rewards)
    assert torch.equal(group_advantages(rewards, group_weight=GroupWeight("band", low=0.1, high=0.9)), grpo)
    narrow = group_advantages(rewards, group_weight=GroupWeight("band", low=0.2, high=0.8))
    edge = (rewards.sum(dim=1) == 1) | (rewards.sum(dim=1) == 7)  # (P,)
    assert edge.any() and (narrow[edge] == 0).all() and torch.equal(narrow[~edge], grpo[~edge])


def test_success_verdicts_define_mu_hat_not_rewards() -> None:
    rewards = torch.tensor([[0.9, 0.1, 0.2, 0.3]], dtype=torch.float64)  # every reward > 0
    success = torch.tensor([[True, False, False, False]])
    got = group_advantages(rewards, scale="none", success=success, group_weight=GroupWeight("maxrl"))
    want = group_advantages(rewards, scale="none") * 4.0  # mu_hat = 1/4 from the verdicts
    torch.testing.assert_close(got, want)
    assert group_weight_values(rewards, GroupWeight("maxrl"), success).tolist() == [4.0]
    assert group_weight_values(rewards, GroupWeight("maxrl")).tolist() == [1.0]


def test_group_weight_values_counts_scorable_completions() -> None:
    rewards = torch.tensor([[1.0, 0.0, float("nan"), float("nan")], [0.0, 0.0, 0.0, 1.0], [float("nan")] * 4])
    weight = GroupWeight(f"{__name__}.sqrt_of_size")
    torch.testing.assert_close(
        group_weight_values(rewards, weight), torch.tensor([math.sqrt(2) * 0.5, 2 * 0.25, 0.0], dtype=torch.float64)
    )
    band = group_weight_values(rewards, GroupWeight("band", low=0.3, high=0.9))
    assert band.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "softmax"}, "group_weight: 'softmax' is neither"),
        ({"kind": "no_such_pkg.fn"}, "group_weight: cannot import module 'no_such_pkg'"),
        ({"kind": "math.no_such_fn"}, "group_weight: 'math' has no callable 'no_such_fn'"),
        ({"kind": "maxrl", "gamma": 0.5}, r"group_weight.gamma is the focal exponent"),
        ({"gamma": -1.0}, r"group_weight.gamma must be finite"),
        ({"gamma": float("nan")}, r"group_weight.gamma must be finite"),
        ({"kind": "band", "low": 0.6, "high": 0.4}, "low < high"),
        ({"kind": "band", "low": 0.2, "high": 1.5}, "high <= 1"),
        ({"kind": "maxrl"}, None),
    ],
)
def test_bad_spec_names_the_setting(kwargs: dict, match: str | None) -> None:
    if match is None:
        GroupWeight(**kwargs)
        return
    with pytest.raises(ValueError, match=match):
        GroupWeight(**kwargs)


@pytest.mark.parametrize(("fn", "match"), [("negative_weight", "finite weights >= 0"), ("wrong_shape", "shape")])
def test_bad_custom_output(fn: str, match: str) -> None:
    weight = GroupWeight(f"{__name__}.{fn}")
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), group_weight=weight)


def test_gamma_and_group_weight_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="gamma .* or group_weight"):
        group_advantages(torch.tensor([[1.0, 0.0]]), gamma=0.5, group_weight=GroupWeight("maxrl"))
