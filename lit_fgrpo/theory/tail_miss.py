"""Lemma 3.1: the probability that an update is active yet misses a rare correct subset."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def _check(group_size: Any, success_mass: Any, rare_mass: Any) -> None:
    n, mu, tau = (np.asarray(torch.as_tensor(v, dtype=torch.float64)) for v in (group_size, success_mass, rare_mass))
    if np.any((mu < 0) | (mu > 1)):
        raise ValueError("tail_miss_probability: success_mass (mu) must lie in [0, 1]")
    if np.any((tau < 0) | (tau > mu)):
        raise ValueError("tail_miss_probability: rare_mass (tau) must lie in [0, success_mass]")
    if np.any(n < 0):
        raise ValueError("tail_miss_probability: group_size (N) must be >= 0")


def tail_miss_probability(group_size: Any, success_mass: Any, rare_mass: Any) -> Any:
    """Pr(group active and no rollout lands in the rare subset E), paper Lemma 3.1.

        Pr(B_{E,N}) = (1 - tau)^N - (mu - tau)^N - (1 - mu)^N

    Each power is evaluated as ``exp(N * log(.))`` (with ``log1p`` for 1 - x), so N = 2**17 and far beyond
    stays accurate and never overflows or underflows to NaN. Elementwise with broadcasting; returns a torch
    tensor (float64) when any input is a tensor, a numpy array otherwise.

    Args:
        group_size: N, rollouts per prompt (>= 0).
        success_mass: mu, the policy's total probability of a correct rollout, in [0, 1].
        rare_mass: tau, the probability of the rare correct subset E, in [0, mu].
    """
    use_torch = any(isinstance(v, Tensor) for v in (group_size, success_mass, rare_mass))
    if use_torch:
        _check(group_size, success_mass, rare_mass)
        n, mu, tau = torch.broadcast_tensors(
            *(torch.as_tensor(v, dtype=torch.float64) for v in (group_size, success_mass, rare_mass))
        )
        term_rare = torch.exp(n * torch.log1p(-tau))
        term_common = torch.where(n == 0, torch.ones_like(n), torch.exp(n * torch.log(mu - tau)))
        term_wrong = torch.where(n == 0, torch.ones_like(n), torch.exp(n * torch.log1p(-mu)))
        return (term_rare - term_common - term_wrong).clamp(min=0.0)
    _check(group_size, success_mass, rare_mass)
    n_np, mu_np, tau_np = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in (group_size, success_mass, rare_mass))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        rare = np.exp(n_np * np.log1p(-tau_np))
        common = np.where(n_np == 0, 1.0, np.exp(n_np * np.log(mu_np - tau_np)))
        wrong = np.where(n_np == 0, 1.0, np.exp(n_np * np.log1p(-mu_np)))
    return np.clip(rare - common - wrong, 0.0, None)
