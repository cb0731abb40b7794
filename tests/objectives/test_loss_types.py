"""The loss-type table: every per-loss-type branch reads it, and an unknown name is one error everywhere."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives import LOSS_TYPES, aggregate_tokens, policy_loss
from lit_fgrpo.objectives.loss_types import LOSS_SPECS, clip_range, loss_spec, piece_aggregation


def _loop_aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, l_max: int, n_items: float) -> float:
    """TRL 1.16's four aggregations written out as loops over rows and tokens (the reference)."""
    rows, tokens = per_token.shape
    total = sum(float(per_token[b, t] * mask[b, t]) for b in range(rows) for t in range(tokens))
    active = sum(float(mask[b, t]) for b in range(rows) for t in range(tokens))
    if loss_type in ("grpo", "gspo"):
        means = []
        for b in range(rows):
            row_active = sum(float(mask[b, t]) for t in range(tokens))
            means.append(sum(float(per_token[b, t] * mask[b, t]) for t in range(tokens)) / max(row_active, 1.0))
        return sum(means) / rows
    if loss_type == "bnpo":
        return total / max(active, 1.0)
    if loss_type == "dr_grpo":
        return total / (rows * l_max)
    return total / max(n_items, 1.0)  # dapo, cispo


def test_the_table_lists_every_loss_type_once() -> None:
    assert tuple(LOSS_SPECS) == LOSS_TYPES == ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "gspo")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregation_matches_the_loop(loss_type: str) -> None:
    gen = torch.Generator().manual_seed(3)
    per_token = torch.randn(5, 7, generator=gen, dtype=torch.float64)  # (B, T)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).to(torch.float64)  # (B, T)
    mask[2] = 0.0  # an empty row: every divisor clamps at 1
    got = aggregate_tokens(per_token, mask, loss_type, max_completion_length=9, num_items=40.0)  # type: ignore[arg-type]
    assert float(got) == pytest.approx(_loop_aggregate(per_token, mask, loss_type, 9, 40.0), rel=1e-12)


def test_clip_defaults_come_from_the_table() -> None:
    assert clip_range("dapo", None, None) == (0.2, 0.28)
    assert clip_range("cispo", None, None) == (1.0, 5.0)
    assert clip_range("gspo", 0.1, None) == (0.1, 4e-4)


@pytest.mark.parametrize(
    "call",
    [
        lambda: loss_spec("ppo"),
        lambda: clip_range("ppo", None, None),
        lambda: aggregate_tokens(torch.ones(1, 2), torch.ones(1, 2), "ppo"),  # type: ignore[arg-type]
        lambda: policy_loss(torch.zeros(1, 2), None, torch.zeros(1), torch.ones(1, 2), "ppo"),  # type: ignore[arg-type]
        lambda: piece_aggregation("ppo", 1, 2, torch.tensor(3.0), torch.tensor(4.0)),  # type: ignore[arg-type]
    ],
    ids=["loss_spec", "clip_range", "aggregate_tokens", "policy_loss", "piece_aggregation"],
)
def test_an_unknown_loss_type_is_one_line_listing_the_known_ones(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and "'ppo'" in message
    assert all(name in message for name in LOSS_TYPES)
