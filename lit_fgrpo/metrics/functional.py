"""The unbiased pass@k estimator (Chen et al. 2021), vectorised and numerically stable."""

from __future__ import annotations

import torch
from torch import Tensor


def pass_at_k(num_samples: Tensor | int, num_correct: Tensor | int, k: int) -> Tensor:
    """Unbiased pass@k per problem: ``1 - C(n - c, k) / C(n, k)``.

    Computed in log space, ``log C(n-c, k) - log C(n, k) = lgamma(n-c+1) - lgamma(n-c-k+1) - lgamma(n+1)
    + lgamma(n-k+1)``, in float64, so n in the thousands stays exact to ~1e-12 and nothing overflows.
    Where ``n - c < k`` every size-k subset holds a correct sample and the value is exactly 1.

    Args:
        num_samples: n, the samples drawn per problem (scalar or any shape).
        num_correct: c, the correct samples among them (broadcastable with ``num_samples``).
        k: the budget, >= 1 and <= every n.

    Returns:
        float64 tensor of pass@k values with the broadcast shape of n and c.

    Raises:
        ValueError: if k < 1, any n < k, any c < 0 or any c > n.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"pass_at_k: k must be an integer >= 1, got {k}")
    n_in, c_in = torch.as_tensor(num_samples), torch.as_tensor(num_correct)
    for name, value in (("num_samples", n_in), ("num_correct", c_in)):
        if value.is_floating_point() and not bool((value == value.round()).all()):
            raise ValueError(f"pass_at_k: {name} must be whole counts, got a non-integer value (a probability?)")
    n = n_in.to(torch.float64)
    c = c_in.to(torch.float64)
    if bool((n < k).any()):
        raise ValueError(f"pass_at_k: every num_samples must be >= k={k}, got min n = {int(n.min())}")
    if bool((c < 0).any()) or bool((c > n).any()):
        raise ValueError("pass_at_k: num_correct must be in [0, num_samples]")
    n, c = torch.broadcast_tensors(n, c)
    n_wrong = n - c
    all_covered = n_wrong < k
    safe_wrong = torch.where(all_covered, torch.full_like(n_wrong, float(k)), n_wrong)
    log_ratio = (
        torch.lgamma(safe_wrong + 1) - torch.lgamma(safe_wrong - k + 1) - torch.lgamma(n + 1) + torch.lgamma(n - k + 1)
    )
    value = torch.where(all_covered, torch.ones_like(n), -torch.expm1(log_ratio))
    return torch.where(c == 0, torch.zeros_like(n), value)  # exactly 0, not lgamma round-off


_LANE_MAX_WORDS = 255  # a byte lane holds at most 255 before it would carry into its neighbour


def count_true_per_row(correct: Tensor) -> Tensor:
    """Row sums of a (P, n) bool tensor, as int64 (P,).

    ``bool.sum`` on the CPU widens every element and runs at ~0.1 G elements/s. On a contiguous CPU tensor
    with n % 8 == 0 we instead reinterpret each 8 booleans as one int64 word and add words: each byte lane
    accumulates its own count (at most 255 words per block, so no carry crosses lanes), then the 8 lanes of
    the block sum are added. Identical results, ~30x faster for 100,000 x 1,024.
    """
    if correct.dim() != 2:
        raise ValueError(f"count_true_per_row: expected (P, n), got shape {tuple(correct.shape)}")
    rows, n = correct.shape
    if correct.dtype != torch.bool or correct.device.type != "cpu" or n % 8 or not correct.is_contiguous():
        return correct.sum(dim=1, dtype=torch.int64)
    words = correct.view(torch.uint8).view(torch.int64)  # (P, n / 8): 8 booleans per word
    total = torch.zeros(rows, dtype=torch.int64)  # (P,)
    for start in range(0, words.shape[1], _LANE_MAX_WORDS):
        lanes = words[:, start : start + _LANE_MAX_WORDS].sum(dim=1)  # (P,) 8 byte-lane counts packed
        total += lanes.view(torch.uint8).view(rows, 8).sum(dim=1, dtype=torch.int64)
    return total
