"""The loss types, in one table: what each one's name means for the ratio, the surrogate, the clip and the divisor.

Every place that behaves differently per loss type (:func:`~lit_fgrpo.objectives.policy_loss.policy_loss`, its
token aggregation, the micro-batch shares below, the clip defaults) reads
:func:`loss_spec`, so a name that is not in :data:`LOSS_SPECS` is one error listing the known ones, never a silent
fall-through to another loss's divisor.

Token aggregations over a (B, T) per-token loss ``l`` and mask ``m`` (TRL 1.16):

* ``sequence_mean``: ``mean_b[ sum_t l m / max(sum_t m, 1) ]`` (grpo, gspo);
* ``batch_tokens``: ``sum l m / max(sum m, 1)``, the batch's own token mean (bnpo);
* ``fixed_length``: ``sum l m / (B * L_max)`` (dr_grpo);
* ``global_tokens``: ``sum l m / max(num_items, 1)``, the generation batch's token count (dapo, cispo).

How per-micro-batch losses add up to TRL's mini-batch loss (clip presets, shares and token divisors).

A mini-batch of ``R`` rows is split into micro-batches for memory; each piece's loss is scaled so that the
gradients sum to the gradient of the whole mini-batch computed as one TRL batch:

* ``grpo`` / ``dr_grpo`` / ``gspo`` average per sequence, so a piece of ``r`` rows weighs ``share = r / R`` (gspo
  aggregates like TRL's ``grpo``: a mean over sequences, no token divisor);
* ``dapo`` / ``cispo`` divide by TRL's ``num_items_in_batch`` (active tokens of the generation batch over all
  ranks / ranks / optimizer steps), passed in unchanged, ``share = 1``;
* ``bnpo`` divides by the mini-batch's own active tokens: it is ``dapo`` with that divisor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from torch import Tensor

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


def clip_range(loss_type: str, epsilon: float | None, epsilon_high: float | None) -> tuple[float, float]:
    """``(epsilon, epsilon_high)``: the given values, else the loss type's defaults in its table entry."""
    spec = loss_spec(loss_type)
    return (spec.epsilon if epsilon is None else epsilon, spec.epsilon_high if epsilon_high is None else epsilon_high)


def token_divisor(global_tokens: Tensor, world_size: int, num_minibatches: int) -> Tensor:
    """TRL's ``num_items_in_batch`` for dapo/cispo: active tokens of all ranks / ranks / optimizer steps."""
    return global_tokens / world_size / num_minibatches


@dataclass(frozen=True)
class PieceAggregation:
    """How one micro-batch enters :func:`~lit_fgrpo.objectives.policy_loss`, and its weight in the sum."""

    loss_type: LossType
    """The loss type passed to ``policy_loss`` (``bnpo`` runs as ``dapo``)."""
    num_items: Tensor | None
    """The token divisor passed to ``policy_loss`` (None for per-sequence losses)."""
    share: float
    """Factor on the piece's loss so that the pieces add up to the mini-batch loss."""


def piece_aggregation(
    loss_type: LossType, piece_rows: int, minibatch_rows: int, minibatch_tokens: Tensor, num_items: Tensor
) -> PieceAggregation:
    """The aggregation of a micro-batch of ``piece_rows`` rows inside a mini-batch of ``minibatch_rows`` rows.

    Args:
        loss_type: the configured loss type.
        piece_rows: rows of this micro-batch (after skipping zero-advantage rows).
        minibatch_rows: rows of the whole mini-batch (before skipping).
        minibatch_tokens: active completion tokens of the whole mini-batch (the bnpo divisor).
        num_items: :func:`token_divisor` of the generation batch (the dapo/cispo divisor).
    """
    aggregation = loss_spec(loss_type).aggregation
    if aggregation in ("sequence_mean", "fixed_length"):  # per-sequence: the rows' share of the mini-batch
        return PieceAggregation(loss_type, None, piece_rows / minibatch_rows)
    if aggregation == "batch_tokens":  # the mini-batch's own token count, passed as dapo's divisor
        return PieceAggregation("dapo", minibatch_tokens, 1.0)
    return PieceAggregation(loss_type, num_items, 1.0)
