"""Pure tensor functions of the algorithm: advantages, focal weight, policy losses, KL."""

from lit_fgrpo.objectives.advantages import AdvantageScale, focal_weight, group_advantages, group_success_rate
from lit_fgrpo.objectives.kl import kl_k3
from lit_fgrpo.objectives.policy_loss import LOSS_TYPES, LossType, aggregate_tokens, policy_loss

__all__ = [
    "LOSS_TYPES",
    "AdvantageScale",
    "LossType",
    "aggregate_tokens",
    "focal_weight",
    "group_advantages",
    "group_success_rate",
    "kl_k3",
    "policy_loss",
]
