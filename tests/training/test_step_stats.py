"""``rollout_stats``: the group shares and the focal weight's median against loops over groups."""

from __future__ import annotations

import statistics

import pytest
import torch

from lit_fgrpo.objectives.advantages import weighted_group_advantages
from lit_fgrpo.objectives.group_weights import GroupWeight
from lit_fgrpo.training.step_stats import rollout_stats


def test_group_shares_tokens_and_median_weight_against_loops() -> None:
    correct = torch.tensor(
        [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool
    )  # (P, G)
    rewards = correct.float()  # (P, G)
    grouped = weighted_group_advantages(rewards, GroupWeight(gamma=0.5), success=correct)
    lengths = torch.arange(1, correct.numel() + 1)  # (B,)
    mask = (torch.arange(30).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (B, T)
    stats = rollout_stats(rewards, grouped.advantages, grouped.weights, grouped.success_rate, mask)

    groups = correct.tolist()
    assert stats["rollout/frac_all_correct"] == pytest.approx(sum(all(g) for g in groups) / len(groups))
    assert stats["rollout/frac_all_wrong"] == pytest.approx(sum(not any(g) for g in groups) / len(groups))
    # the focal weights (1 - mu_hat)^0.5 of the mixed groups only: 1/4, 2/4 and 3/4 solved
    active = [(1 - sum(g) / len(g)) ** 0.5 for g in groups if 0 < sum(g) < len(g)]
    # torch's median of an even count is the lower middle value
    assert stats["focal/weight_median"] == pytest.approx(statistics.median_low(active))


def test_no_active_group_reports_weight_one() -> None:
    correct = torch.ones(2, 3, dtype=torch.bool)  # (P, G)
    grouped = weighted_group_advantages(correct.float(), GroupWeight(gamma=1.0), success=correct)
    stats = rollout_stats(correct.float(), grouped.advantages, grouped.weights, grouped.success_rate, torch.ones(6, 2))
    assert stats["rollout/frac_all_correct"] == 1.0
    assert stats["focal/weight_median"] == 1.0
