"""Pure tensor functions of the algorithm: advantages, group weights, policy losses, KL."""

from lit_fgrpo.objectives.advantages import AdvantageScale, GroupAdvantages, group_advantages, weighted_group_advantages
from lit_fgrpo.objectives.group_weights import (
    GROUP_WEIGHT_KINDS,
    GroupWeight,
    GroupWeightKind,
    focal_weight,
    group_success_rate,
    group_weight_values,
)
from lit_fgrpo.objectives.kl import kl_k3
from lit_fgrpo.objectives.loss_types import LOSS_TYPES, LossType, aggregate_tokens, policy_loss

__all__ = [
    "GROUP_WEIGHT_KINDS",
    "LOSS_TYPES",
    "AdvantageScale",
    "GroupAdvantages",
    "GroupWeight",
    "GroupWeightKind",
    "LossType",
    "aggregate_tokens",
    "focal_weight",
    "group_advantages",
    "group_success_rate",
    "group_weight_values",
    "kl_k3",
    "policy_loss",
    "weighted_group_advantages",
]
