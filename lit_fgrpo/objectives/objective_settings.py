"""``ObjectiveSettings``: what the update optimises (``--model.objective.*``), typed, documented, checked once.

The loss type, its clip range, the per-group weight (focal with ``gamma``, or another ``group_weight``), the KL
coefficient, the advantage normalisation, the training temperature and the train/inference mismatch correction.
A wrong value is one :class:`~lit_fgrpo.errors.ConfigError` naming the full flag, raised on construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.advantages import AdvantageScale
from lit_fgrpo.objectives.group_weights import GroupWeight, check_gamma
from lit_fgrpo.objectives.loss_types import LossType, clip_range, loss_spec

ImportanceCorrection = Literal["none", "token", "sequence"]
"""Train/inference mismatch correction: none, or truncated importance sampling per token or per sequence."""
FLAG = "--model.objective"
"""How the CLI names these settings."""


@dataclass(frozen=True)
class ObjectiveSettings:
    """The policy objective: loss type and clips, group weight, KL, advantage scale, temperature, IS correction."""

    gamma: float = 0.5
    """The focal exponent: the advantage of each group is scaled by (1 - mu_hat) ** gamma. 0 = the base method."""
    group_weight: GroupWeight | None = None
    """Another per-group weight w(mu_hat, G) in place of the focal one (``maxrl``, ``band``, a dotted path; see
    :mod:`lit_fgrpo.objectives.group_weights`); needs ``gamma: 0``. Assumes binary verdicts."""
    loss_type: LossType = "grpo"
    """grpo, bnpo, dr_grpo, dapo, cispo or gspo (sets the clip defaults and the token aggregation)."""
    epsilon: float | None = None
    """Lower clip (default by loss type: 0.2, cispo 1.0)."""
    epsilon_high: float | None = None
    """Upper clip (default by loss type: 0.2, dapo 0.28, cispo 5.0)."""
    beta: float = 0.0
    """k3 KL coefficient; > 0 keeps a frozen reference (for LoRA: the base with adapters disabled)."""
    scale_rewards: AdvantageScale = "group"
    """Divide the centred rewards by the group std ("group"), the batch std ("batch") or not at all ("none")."""
    advantage_eps: float = 1e-6
    """Added to the std (verl 1e-6, TRL 1e-4)."""
    temperature: float = 1.0
    """Sampling temperature, also applied to the training logits; ``--rollout.sampling.temperature`` must equal it
    (the configs link them: ``temperature: ${model.objective.temperature}``; another value is refused)."""
    importance_correction: ImportanceCorrection = "none"
    """Train/inference mismatch correction with the engine's sampling log-probs: "none", "token" or "sequence"
    truncated importance sampling."""
    importance_cap: float = 3.0
    """Cap C of the truncated importance weights."""

    def __post_init__(self) -> None:
        if isinstance(self.group_weight, Mapping):  # as stored in a checkpoint's hyperparameters
            object.__setattr__(self, "group_weight", GroupWeight(**self.group_weight))
        for name in ("epsilon", "epsilon_high", "beta", "advantage_eps", "temperature", "importance_cap"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(float(value)):
                raise ConfigError(f"{FLAG}.{name} must be finite, got {value}")
        if self.group_weight is not None and self.gamma != 0:
            raise ConfigError(
                f"{FLAG}.gamma={self.gamma} and {FLAG}.group_weight (kind {self.group_weight.kind!r}) are both set; "
                "the group weight replaces the focal one",
                hint=f"set {FLAG}.gamma 0 to use {FLAG}.group_weight, or drop group_weight for F-GRPO",
            )
        check_gamma(float(self.gamma), f"{FLAG}.gamma")
        loss_spec(self.loss_type)  # the table's one-line refusal of an unknown name
        for name, choices in (("scale_rewards", AdvantageScale), ("importance_correction", ImportanceCorrection)):
            if getattr(self, name) not in get_args(choices):
                raise ConfigError(f"{FLAG}.{name} must be one of {get_args(choices)}, got {getattr(self, name)!r}")
        epsilon, high = self.epsilon, self.epsilon_high
        checks = [
            (epsilon is None or 0 <= epsilon <= 1, f"{FLAG}.epsilon must be in [0, 1], got {epsilon} (the ratio's "
             "lower clip bound 1 - epsilon would be negative)"),
            (high is None or high >= 0, f"{FLAG}.epsilon_high must be >= 0, got {high}"),
            (epsilon is None or high is None or high >= epsilon, f"{FLAG}.epsilon_high={high} is below "
             f"{FLAG}.epsilon={epsilon}: the clip range's upper side 1 + epsilon_high would be narrower than its "
             "lower one (the asymmetric clip widens the upper side)"),
            (self.beta >= 0, f"{FLAG}.beta must be >= 0, got {self.beta}"),
            (self.temperature > 0, f"{FLAG}.temperature must be > 0, got {self.temperature}"),
            (self.advantage_eps > 0, f"{FLAG}.advantage_eps must be > 0, got {self.advantage_eps}"),
            (self.importance_cap > 0, f"{FLAG}.importance_cap must be > 0, got {self.importance_cap}"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def weight(self) -> GroupWeight:
        """The per-group weight the advantages are multiplied by: ``group_weight``, else focal with ``gamma``."""
        return self.group_weight if self.group_weight is not None else GroupWeight("focal", gamma=float(self.gamma))

    @property
    def clip(self) -> tuple[float, float]:
        """``(epsilon, epsilon_high)``: the given clips, else the loss type's defaults."""
        return clip_range(self.loss_type, self.epsilon, self.epsilon_high)
