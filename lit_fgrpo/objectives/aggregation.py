"""How per-micro-batch losses add up to TRL's mini-batch loss: clip presets, shares and token divisors.

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

from torch import Tensor

from lit_fgrpo.objectives.loss_types import LossType, loss_spec


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
