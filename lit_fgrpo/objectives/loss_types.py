"""The loss types, in one table: what each one's name means for the ratio, the surrogate, the clip and the divisor.

Every place that behaves differently per loss type (:func:`~lit_fgrpo.objectives.policy_loss.policy_loss`, its
token aggregation, the micro-batch shares of :mod:`~lit_fgrpo.objectives.aggregation`, the clip defaults) reads
:func:`loss_spec`, so a name that is not in :data:`LOSS_SPECS` is one error listing the known ones, never a silent
fall-through to another loss's divisor.

Token aggregations over a (B, T) per-token loss ``l`` and mask ``m`` (TRL 1.16):

* ``sequence_mean``: ``mean_b[ sum_t l m / max(sum_t m, 1) ]`` (grpo, gspo);
* ``batch_tokens``: ``sum l m / max(sum m, 1)``, the batch's own token mean (bnpo);
* ``fixed_length``: ``sum l m / (B * L_max)`` (dr_grpo);
* ``global_tokens``: ``sum l m / max(num_items, 1)``, the generation batch's token count (dapo, cispo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from lit_fgrpo.errors import ConfigError

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "gspo"]
"""The loss-type names: written here once."""

TokenAggregation = Literal["sequence_mean", "batch_tokens", "fixed_length", "global_tokens"]


@dataclass(frozen=True)
class LossSpec:
    """What one loss type does, read by every per-loss-type branch."""

    epsilon: float
    """Default lower clip: the ratio is clipped to ``[1 - epsilon, 1 + epsilon_high]``."""
    epsilon_high: float
    """Default upper clip (DAPO's clip-higher 0.28; CISPO 5.0, so its weight lies in [0, 6])."""
    aggregation: TokenAggregation
    """How the (B, T) per-token loss becomes one scalar (see the module docstring)."""
    sequence_ratio: bool = False
    """One length-normalised ratio per sequence (GSPO) instead of one per token."""
    cispo_surrogate: bool = False
    """CISPO's ``-sg(clamp(w)) * A * logp`` instead of the PPO-style ``-min(w A, clamp(w) A)``."""


LOSS_SPECS: dict[str, LossSpec] = {
    "grpo": LossSpec(0.2, 0.2, "sequence_mean"),
    "bnpo": LossSpec(0.2, 0.2, "batch_tokens"),
    "dr_grpo": LossSpec(0.2, 0.2, "fixed_length"),
    "dapo": LossSpec(0.2, 0.28, "global_tokens"),
    "cispo": LossSpec(1.0, 5.0, "global_tokens", cispo_surrogate=True),
    "gspo": LossSpec(3e-4, 4e-4, "sequence_mean", sequence_ratio=True),
}
"""Every loss type (paper Table 5 for the clips; GSPO paper §5.1 and TRL's recommended values for gspo)."""

LOSS_TYPES: tuple[str, ...] = get_args(LossType)
"""The names of :data:`LOSS_SPECS`, in declaration order."""
assert tuple(LOSS_SPECS) == LOSS_TYPES, "LossType and LOSS_SPECS must list the same names"


def loss_spec(loss_type: str, arg: str = "--model.objective.loss_type") -> LossSpec:
    """The table entry of ``loss_type``.

    Raises:
        ConfigError: one line naming ``arg``, the value and the known loss types.
    """
    try:
        return LOSS_SPECS[loss_type]
    except (KeyError, TypeError):
        raise ConfigError(f"{arg} must be one of {', '.join(LOSS_TYPES)}; got {loss_type!r}") from None
