"""Focal group-relative advantages (F-GRPO, paper eqs. 11-13).

For prompt p with G completions, rewards r_{p,1..G} and verifier verdicts c_{p,1..G}:

    mu_hat_p = X_p / G_p                      (empirical success rate, eq. 11)
    g_p      = (1 - mu_hat_p) ** gamma        (focal weight, eq. 12)
    A_{p,i}  = g_p * (r_{p,i} - mean_p(r)) / (std + eps)   (eq. 13)

where std is the Bessel-corrected std of the group (``scale="group"``), of the whole batch (``"batch"``)
or no division at all (``scale="none"``, Dr.GRPO). gamma = 0 gives plain GRPO.

``gamma`` is the simple way to get F-GRPO; ``group_weight`` (:class:`~lit_fgrpo.objectives.group_weights.GroupWeight`)
swaps g_p for another per-group weight w(mu_hat_p, G_p): MaxRL's 1/mu_hat, a success-rate band, or a custom
function. Like the focal weight, these assume binary correctness verdicts.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.group_weights import GroupWeight, check_gamma, focal_weight, group_success_rate

__all__ = ["AdvantageScale", "GroupAdvantages", "check_verdicts", "focal_weight", "group_advantages",
           "group_success_rate", "weighted_group_advantages"]  # fmt: skip

AdvantageScale = Literal["group", "batch", "none"]
_SCALES = ("group", "batch", "none")


def _check_inputs(rewards: Tensor, gamma: float | None, scale: str, success: Tensor | None, eps: float) -> None:
    if rewards.dim() != 2:
        raise ValueError(
            f"group_advantages: rewards must be 2-D (P prompts, G samples), got shape {tuple(rewards.shape)}"
        )
    if success is not None and success.shape != rewards.shape:
        raise ValueError(
            f"group_advantages: success shape {tuple(success.shape)} does not match rewards shape {tuple(rewards.shape)}"
        )
    if gamma is not None:  # None: the group weight was given (and checked when it was built)
        check_gamma(gamma, "group_advantages: gamma")
    if not math.isfinite(eps) or eps <= 0:
        raise ConfigError(f"group_advantages: eps must be finite and > 0, got {eps}")
    if scale not in _SCALES:
        raise ConfigError(f"group_advantages: scale must be one of {_SCALES}, got {scale!r}")
    if rewards.is_floating_point() and bool(torch.isinf(rewards).any()):
        where = tuple(int(i) for i in torch.isinf(rewards).nonzero()[0])
        raise ValueError(f"group_advantages: rewards must be finite or NaN (unscorable), got inf at (p, g) = {where}")
    if success is not None:
        check_verdicts("group_advantages: success", success)


def check_verdicts(name: str, verdicts: Tensor) -> None:
    """Refuse verdicts that are not boolean: a bool tensor, or integers that are all 0 or 1.

    A float tensor (a probability, a reward) is refused even when it holds only 0.0 and 1.0: a verdict is a yes/no.

    Raises:
        ValueError: Naming ``name``, the dtype, or the first value outside {0, 1}.
    """
    if verdicts.dtype == torch.bool:
        return
    if verdicts.is_floating_point() or verdicts.is_complex():
        raise ValueError(f"{name} must be boolean (or 0/1 integers), got dtype {verdicts.dtype}")
    outside = (verdicts != 0) & (verdicts != 1)
    if bool(outside.any()):
        raise ValueError(f"{name} must be boolean (or 0/1 integers), got {int(verdicts[outside][0])}")


class GroupAdvantages(NamedTuple):
    """The advantages of a batch of groups with the per-group quantities they were built from (computed once)."""

    advantages: Tensor
    """(P, G) advantages, detached, in the rewards' floating dtype (float32 for integer rewards)."""
    weights: Tensor
    """(P,) float64 group weights w(mu_hat, G) applied (exactly 1 for plain GRPO)."""
    success_rate: Tensor
    """(P,) float64 mu_hat: correct over scorable completions of each group."""


def group_advantages(
    rewards: Tensor,
    gamma: float = 0.0,
    scale: AdvantageScale = "group",
    success: Tensor | None = None,
    eps: float = 1e-6,
    group_weight: GroupWeight | None = None,
) -> Tensor:
    """Group-relative advantages multiplied by the focal weight (or another group weight) of their group.

    Args:
        rewards: (P, G) rewards, one row per prompt. NaN marks an unscorable completion: it is left out of
            the group statistics and gets advantage 0.
        gamma: focal exponent; 0 is plain GRPO (bit-for-bit).
        scale: ``"group"`` divides by the group's Bessel-corrected std, ``"batch"`` by the std of every
            scorable reward in the batch, ``"none"`` does not divide (Dr.GRPO).
        success: optional (P, G) bool verdicts that define mu_hat = X / G. When None a completion counts as
            correct when its reward is > 0. G counts scorable (non-NaN) completions only.
        eps: added to the std before dividing (verl uses 1e-6, TRL 1e-4).
        group_weight: another per-group weight w(mu_hat, G) in place of the focal weight (``gamma`` must then
            be 0); e.g. ``GroupWeight("maxrl")`` with ``scale="none"`` is MaxRL's ``(r - mean) / mean``.

    Returns:
        (P, G) advantages, detached, in the rewards' floating dtype (float32 for integer rewards). A group whose
        scorable rewards are all equal gets exactly 0.
    """
    _check_inputs(rewards, gamma, scale, success, eps)
    if group_weight is not None and gamma != 0:
        raise ValueError(f"group_advantages: pass gamma ({gamma}) or group_weight ({group_weight.kind!r}), not both")
    weight = group_weight if group_weight is not None else GroupWeight("focal", gamma=gamma)
    return weighted_group_advantages(rewards, weight, scale, success, eps).advantages


def weighted_group_advantages(
    rewards: Tensor,
    weight: GroupWeight,
    scale: AdvantageScale = "group",
    success: Tensor | None = None,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """:func:`group_advantages` with its group weight given, returning the weights and success rates it used.

    The training step calls this once and hands the weights and mu_hat to the logged statistics, so that nothing
    computes them a second time.
    """
    _check_inputs(rewards, None, scale, success, eps)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.detach().to(torch.float64)  # (P, G)
    valid = ~torch.isnan(r)  # (P, G)
    num_valid = valid.sum(dim=1, keepdim=True)  # (P, 1)
    r0 = torch.where(valid, r, torch.zeros_like(r))  # (P, G)
    mean = r0.sum(dim=1, keepdim=True) / num_valid.clamp(min=1)  # (P, 1)
    centred = torch.where(valid, r - mean, torch.zeros_like(r))  # (P, G)

    if scale == "group":
        var = (centred**2).sum(dim=1, keepdim=True) / (num_valid - 1).clamp(min=1)  # (P, 1)
        centred = centred / (var.sqrt() + eps)
    elif scale == "batch":
        flat = r[valid]  # (V,)
        batch_std = flat.std() if flat.numel() > 1 else flat.new_zeros(())
        centred = centred / (batch_std + eps)

    # A constant group must give exactly 0: r - mean can be a few ulps off for non-representable rewards.
    big = torch.finfo(torch.float64).max
    r_max = torch.where(valid, r, torch.full_like(r, -big)).amax(dim=1, keepdim=True)  # (P, 1)
    r_min = torch.where(valid, r, torch.full_like(r, big)).amin(dim=1, keepdim=True)  # (P, 1)
    constant = (r_max <= r_min) | (num_valid < 2)  # (P, 1)
    centred = torch.where(constant, torch.zeros_like(centred), centred)

    verdict = success.to(torch.bool) if success is not None else (r0 > 0)  # (P, G)
    success_rate, weights = weight.of_groups(verdict, valid)  # (P,), (P,) or None
    if weights is None:  # plain GRPO, bit for bit: no multiplication at all
        weights = torch.ones_like(success_rate)  # (P,)
    else:
        centred = centred * weights.unsqueeze(1)
    return GroupAdvantages(centred.to(out_dtype), weights, success_rate)
