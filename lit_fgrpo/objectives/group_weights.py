"""Group weights: one per-group scalar ``w(mu_hat, G)`` that multiplies the normalised advantages.

F-GRPO's focal weight is one member of a family of success-rate-dependent group weights that peers ship
separately (docs peers-2026-late.md §1.1, §1.3, §2). Here they share one hook::

    A_{p,i} = w(mu_hat_p, G_p) * (r_{p,i} - mean_p(r)) / (std + eps)

with mu_hat_p = X_p / G_p the group's success rate over its G_p scorable completions. Built-ins:

* ``focal``:  ``w = (1 - mu_hat) ** gamma`` (F-GRPO, paper eq. 12; gamma = 0 is plain GRPO).
* ``maxrl``:  ``w = 1 / mu_hat`` for mu_hat > 0, and ``w = 0`` for a group with no success (MaxRL, arXiv
  2602.02710, as shipped by prime-rl ``max_rl``: "reward minus group mean, divided by group mean when positive";
  SkyRL adds 1e-6 to the divisor). With ``scale="none"`` and binary rewards this is exactly MaxRL's advantage
  ``(r - mean) / mean``; with ``scale="group"`` it is MaxRL's 1/p up-weighting on top of GRPO's std scaling.
* ``band``:   ``w = 1`` when ``low < mu_hat < high`` (strict), else 0 (ROLL's ``difficulty_mask``; with the
  defaults (0, 1) it is a zero-variance filter for binary rewards).
* a dotted path ``"package.module.function"`` (or ``"package.module:function"``) to
  ``fn(success_rate: Tensor (P,) float64, group_size: Tensor (P,) int64) -> Tensor (P,)`` of finite weights >= 0.

These weights assume **binary correctness**: mu_hat is the fraction of completions judged correct, and
``maxrl``'s identity ``mean(r) = mu_hat`` only holds when the reward is the 0/1 verdict. With shaped or
continuous rewards they are still well defined (mu_hat comes from the verdicts), but they no longer are the
published estimators, as the MaxRL reviewers on TRL (PR #5026) insisted.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lit_fgrpo.errors import ConfigError

GroupWeightKind = Literal["focal", "maxrl", "band"]
GROUP_WEIGHT_KINDS: tuple[str, ...] = ("focal", "maxrl", "band")
GroupWeightFn = Callable[[Tensor, Tensor], Tensor]
_ARG = "--model.objective.group_weight"  # the setting's name in error messages


def check_gamma(gamma: float, name: str) -> None:
    """The one rule for the focal exponent: finite and >= 0; ``name`` is the flag or argument in the message.

    Raises:
        ConfigError: ``<name> must be finite and >= 0, got <gamma>``.
    """
    if not math.isfinite(gamma) or gamma < 0:
        raise ConfigError(f"{name} must be finite and >= 0, got {gamma}")


def focal_weight(success_rate: Tensor, gamma: float) -> Tensor:
    """Focal weight ``g = (1 - success_rate) ** gamma`` (paper eq. 12).

    Args:
        success_rate: empirical success rate(s) mu_hat in [0, 1], any shape.
        gamma: focusing exponent >= 0. ``gamma = 0`` returns exactly 1 everywhere (even where mu_hat = 1).

    Returns:
        A tensor of the same shape as ``success_rate``, in [0, 1].
    """
    check_gamma(gamma, "focal_weight: gamma")
    success_rate = torch.as_tensor(success_rate)
    if not success_rate.is_floating_point():
        success_rate = success_rate.float()
    if gamma == 0:
        # 0 ** 0 is 1 in torch, but be explicit: gamma = 0 must be *exactly* the base method.
        return torch.ones_like(success_rate)
    return (1.0 - success_rate.clamp(0.0, 1.0)) ** gamma


def group_success_rate(success: Tensor, valid: Tensor) -> Tensor:
    """mu_hat = (correct and scorable completions) / (scorable completions), per group; (P, G) -> (P,)."""
    num_valid = valid.sum(dim=1)  # (P,)
    num_correct = (success & valid).sum(dim=1)  # (P,)
    return num_correct.to(torch.float64) / num_valid.clamp(min=1).to(torch.float64)  # (P,)


def _load_dotted(path: str, arg: str) -> GroupWeightFn:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"{arg}: {path!r} is neither one of {GROUP_WEIGHT_KINDS} nor a dotted path 'package.module.function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{arg}: cannot import module {module_name!r} of {path!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{arg}: {module_name!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True)
class GroupWeight:
    """Which per-group weight multiplies the advantages, and its parameters (validated on construction)."""

    kind: GroupWeightKind | str = "focal"
    """``focal``, ``maxrl``, ``band``, or a dotted path to ``fn(success_rate, group_size) -> weights``."""
    gamma: float = 0.0
    """focal exponent (``focal`` only); 0 gives weight 1 everywhere (plain GRPO)."""
    low: float = 0.0
    """``band``: keep groups whose success rate is strictly above ``low``."""
    high: float = 1.0
    """``band``: keep groups whose success rate is strictly below ``high``."""

    def __post_init__(self) -> None:
        a = _ARG
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"{a}: kind must be one of {GROUP_WEIGHT_KINDS} or a dotted path, got {self.kind!r}")
        check_gamma(self.gamma, f"{a}.gamma")
        if self.kind != "focal" and self.gamma != 0:
            raise ValueError(f"{a}.gamma is the focal exponent; it must be 0 for kind {self.kind!r}")
        if not (0.0 <= self.low < self.high <= 1.0):
            raise ValueError(f"{a}: band needs 0 <= low < high <= 1, got low={self.low}, high={self.high}")
        if self.kind not in GROUP_WEIGHT_KINDS:
            _load_dotted(self.kind, a)  # fail at configuration time, not at the first training step

    def __call__(self, success_rate: Tensor, group_size: Tensor) -> Tensor:
        """Weights ``w`` (P,) in float64 for success rates ``mu_hat`` (P,) of groups of ``group_size`` (P,)."""
        mu = torch.as_tensor(success_rate).to(torch.float64)  # (P,)
        if self.kind == "focal":
            return focal_weight(mu, self.gamma)  # (P,)
        if self.kind == "maxrl":
            return torch.where(mu > 0, 1.0 / mu.clamp(min=torch.finfo(mu.dtype).tiny), torch.zeros_like(mu))
        if self.kind == "band":
            return ((mu > self.low) & (mu < self.high)).to(mu.dtype)  # (P,)
        weights = torch.as_tensor(_load_dotted(self.kind, _ARG)(mu, torch.as_tensor(group_size)))
        if weights.shape != mu.shape:
            raise ConfigError(f"{_ARG}: {self.kind} returned shape {tuple(weights.shape)}, expected {tuple(mu.shape)}")
        weights = weights.to(torch.float64)
        if not torch.isfinite(weights).all() or (weights < 0).any():
            raise ConfigError(f"{_ARG}: {self.kind} must return finite weights >= 0, got {weights.tolist()}")
        return weights

    @property
    def is_identity(self) -> bool:
        """True when every weight is exactly 1 (focal with gamma = 0): the plain GRPO advantage."""
        return self.kind == "focal" and self.gamma == 0

    def of_groups(self, verdicts: Tensor, valid: Tensor) -> tuple[Tensor, Tensor | None]:
        """Each group's success rate and weight, in one call: what the advantages of a batch of groups need.

        Args:
            verdicts: (P, G) bool, a completion judged correct.
            valid: (P, G) bool, a completion scorable; mu_hat and G count these only.

        Returns:
            ``(success_rate, weights)``: (P,) float64 mu_hat, and (P,) float64 weights, or None when every weight
            is exactly 1 (:attr:`is_identity`: the advantages are then not multiplied at all).
        """
        success_rate = group_success_rate(verdicts, valid)  # (P,)
        if self.is_identity:
            return success_rate, None
        return success_rate, self(success_rate, valid.sum(dim=1))  # (P,), (P,)


def weighted_rates(weight: GroupWeight, group_size: int) -> list[float]:
    """The success rates ``k / G`` (0 < k < G) of a group of ``group_size`` G that ``weight`` gives a weight > 0.

    Groups with no success or all successes have advantage 0 anyway; an empty list means no group of that size
    can ever contribute (a ``band`` between two neighbouring ``k / G``, a user weight that is 0 there).
    """
    rates = torch.arange(1, group_size, dtype=torch.float64) / group_size  # (G - 1,)
    weights = weight(rates, torch.full_like(rates, group_size, dtype=torch.int64))  # (G - 1,)
    return [float(rate) for rate, w in zip(rates.tolist(), weights.tolist(), strict=True) if w > 0]


def group_weight_values(rewards: Tensor, weight: GroupWeight, success: Tensor | None = None) -> Tensor:
    """The weight of each group of ``rewards`` (P, G), as :func:`group_advantages` applies it; (P,) float64.

    mu_hat and G count scorable (non-NaN) completions; a completion is correct when ``success`` says so, or,
    when ``success`` is None, when its reward is > 0 (the same rule as :func:`group_advantages`).
    """
    r = rewards.detach().to(torch.float64)  # (P, G)
    valid = ~torch.isnan(r)  # (P, G)
    verdict = success.to(torch.bool) if success is not None else (torch.nan_to_num(r) > 0)  # (P, G)
    return weight(group_success_rate(verdict, valid), valid.sum(dim=1))  # (P,)
