"""The policy loss of every loss type: one table of what each name means, the clipped surrogate, its token
aggregation (TRL 1.16's, exactly) and how micro-batch losses add up to a mini-batch's.

Every place that behaves differently per loss type (:func:`policy_loss`, its token aggregation, the micro-batch
shares, the clip defaults) reads :func:`loss_spec`, so a name that is not in :data:`LOSS_SPECS` is one error listing
the known ones, never a silent fall-through to another loss's divisor.

Per token, with ratio w = exp(logp - old_logp) and A the (focal) advantage of the row:

* grpo / bnpo / dr_grpo / dapo:  ``l = -min(w * A, clamp(w, 1 - eps, 1 + eps_high) * A)``
* cispo:                          ``l = -sg(clamp(w, 1 - eps, 1 + eps_high)) * A * logp``
* gspo:   the grpo formula with one sequence-level ratio per row (GSPO, arXiv 2507.18071),
  ``w_b = exp( sum_t (logp - old_logp) m / max(sum_t m, 1) )``, clipped per sequence; TRL 1.16's
  ``importance_sampling_level="sequence"`` with ``loss_type="grpo"`` (the paper's setup). The GSPO paper clips
  far tighter than GRPO: epsilon = 3e-4, epsilon_high = 4e-4.

plus ``beta * kl_k3`` when beta > 0. Token aggregations over a (B, T) per-token loss ``l`` and mask ``m``:

* ``sequence_mean``: ``mean_b[ sum_t l m / max(sum_t m, 1) ]`` (grpo, gspo);
* ``batch_tokens``: ``sum l m / max(sum m, 1)``, the batch's own token mean (bnpo);
* ``fixed_length``: ``sum l m / (B * L_max)`` (dr_grpo);
* ``global_tokens``: ``sum l m / max(num_items, 1)``, the generation batch's token count (dapo, cispo), so that
  mini-batches of one rollout add up to one global token mean.

CISPO convention: we follow the paper and verl, where the importance weight is clamped to
``[1 - epsilon, 1 + epsilon_high]``; the paper's setting epsilon=1.0, epsilon_high=5.0 gives w in [0, 6].
TRL instead uses an absolute cap ``min(w, epsilon_high_trl)``. The two agree when our
``epsilon >= 1`` (no lower clip, since w > 0) and ``1 + epsilon_high == epsilon_high_trl``.

Micro-batches (:func:`piece_aggregation`): a mini-batch of ``R`` rows is split into micro-batches for memory; each
piece's loss is scaled so that the gradients sum to the gradient of the whole mini-batch computed as one TRL batch:

* ``grpo`` / ``dr_grpo`` / ``gspo`` average per sequence, so a piece of ``r`` rows weighs ``share = r / R`` (gspo
  aggregates like TRL's ``grpo``: a mean over sequences, no token divisor);
* ``dapo`` / ``cispo`` divide by TRL's ``num_items_in_batch`` (active tokens of the generation batch over all
  ranks / ranks / optimizer steps), passed in unchanged, ``share = 1``;
* ``bnpo`` divides by the mini-batch's own active tokens: it is ``dapo`` with that divisor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives.kl import kl_k3

__all__ = [
    "LOSS_SPECS", "LOSS_TYPES", "LossSpec", "LossType", "PieceAggregation", "aggregate_tokens", "clip_range",
    "loss_spec", "piece_aggregation", "policy_loss", "token_divisor",
]  # fmt: skip

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


def _check(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    loss_type: str,
    epsilon: float,
    epsilon_high: float,
    ref_logp: Tensor | None,
    beta: float,
    max_completion_length: int | None,
) -> LossSpec:
    """Refuse inputs ``policy_loss`` cannot use; returns the loss type's table entry."""
    spec = loss_spec(loss_type, "policy_loss: loss_type")
    if logp.dim() != 2:
        raise ValueError(f"policy_loss: logp must be (B, T), got shape {tuple(logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"policy_loss: mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    if old_logp is not None and old_logp.shape != logp.shape:
        raise ValueError(f"policy_loss: old_logp shape {tuple(old_logp.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(
            f"policy_loss: advantages must be (B,) = ({logp.shape[0]},), got shape {tuple(advantages.shape)}"
        )
    if epsilon < 0 or epsilon_high < 0:
        raise ValueError(f"policy_loss: epsilon and epsilon_high must be >= 0, got {epsilon}, {epsilon_high}")
    if beta < 0:
        raise ValueError(f"policy_loss: beta must be >= 0, got {beta}")
    if beta > 0 and ref_logp is None:
        raise ValueError("policy_loss: beta > 0 needs ref_logp (the reference model's log-probs)")
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"policy_loss: ref_logp shape {tuple(ref_logp.shape)} != logp shape {tuple(logp.shape)}")
    if spec.aggregation == "fixed_length" and (max_completion_length is None or max_completion_length < 1):
        raise ValueError("policy_loss: loss_type='dr_grpo' needs max_completion_length >= 1 (the L_max normaliser)")
    return spec


def aggregate_tokens(
    per_token: Tensor,
    mask: Tensor,
    loss_type: LossType,
    max_completion_length: int | None = None,
    num_items: float | Tensor | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar exactly as TRL 1.16 does for ``loss_type``."""
    masked = per_token * mask  # (B, T); a gspo per-sequence (B, 1) loss broadcasts
    aggregation = loss_spec(loss_type, "aggregate_tokens: loss_type").aggregation
    if aggregation == "sequence_mean":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
    if aggregation == "batch_tokens":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if aggregation == "fixed_length":
        assert max_completion_length is not None
        return masked.sum() / (per_token.shape[0] * max_completion_length)
    denom = mask.sum() if num_items is None else torch.as_tensor(num_items, dtype=per_token.dtype)
    return masked.sum() / denom.clamp(min=1.0)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    loss_type: LossType = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    num_items: float | Tensor | None = None,
    importance_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate loss of ``loss_type``, aggregated like TRL 1.16 (one process, no accumulation).

    Args:
        logp: (B, T) log-probs of the sampled tokens under the current policy (with grad).
        old_logp: (B, T) log-probs under the policy that generated the rollouts; None means ``logp.detach()``
            (ratio exactly 1, as TRL when it does not store them).
        advantages: (B,) advantage of each row (already focal-weighted).
        mask: (B, T) 1 for completion tokens that count, 0 for padding.
        loss_type: one of grpo, bnpo, dr_grpo, dapo, cispo, gspo.
        epsilon: lower clip; the ratio is clipped to ``[1 - epsilon, 1 + epsilon_high]``.
        epsilon_high: upper clip; defaults to ``epsilon`` (DAPO's clip-higher uses 0.28).
        ref_logp: (B, T) reference log-probs; needed when beta > 0, and used for the logged KL otherwise.
        beta: coefficient of the per-token k3 KL penalty (not scaled by the focal weight).
        max_completion_length: L_max, needed by dr_grpo.
        num_items: active tokens of the whole generation batch, the dapo/cispo divisor; defaults to mask.sum().
        importance_weights: optional (B, T) or (B, 1) detached train/inference mismatch correction multiplied
            into the policy term (TRL's vLLM importance sampling), before the KL is added.

    Returns:
        ``(loss, stats)``: the scalar loss and detached statistics ``clip_frac_low``, ``clip_frac_high``,
        ``clip_frac`` (either), ``ratio_mean``, ``kl`` (token means over the mask; for gspo each sequence's
        ratio and clip verdict counts once per token, where TRL logs a plain mean over sequences).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    spec = _check(logp, old_logp, advantages, mask, loss_type, epsilon, eps_high, ref_logp, beta, max_completion_length)
    mask = mask.to(logp.dtype)
    if old_logp is None:
        old_logp = logp.detach()
    if spec.sequence_ratio:  # one length-normalised ratio per sequence
        seq_log_ratio = ((logp - old_logp) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
        ratio = torch.exp(seq_log_ratio).unsqueeze(1)  # (B, 1)
    else:
        ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + eps_high)  # (B, T) or (B, 1)
    if spec.cispo_surrogate:
        per_token = -clipped_ratio.detach() * adv * logp  # (B, T)
    else:
        per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # (B, T) or (B, 1)
    if importance_weights is not None:
        per_token = per_token * importance_weights.detach()
    kl = kl_k3(logp, ref_logp) if ref_logp is not None else None  # (B, T)
    if beta > 0 and kl is not None:
        per_token = per_token + beta * kl
    loss = aggregate_tokens(per_token, mask, loss_type, max_completion_length, num_items)

    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - epsilon) & (adv < 0)).to(mask.dtype)  # (B, T)
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(mask.dtype)  # (B, T)
        stats = {
            "clip_frac_low": (low * mask).sum() / n_tok,
            "clip_frac_high": (high * mask).sum() / n_tok,
            "clip_frac": (torch.maximum(low, high) * mask).sum() / n_tok,
            "ratio_mean": (ratio * mask).sum() / n_tok,
            "kl": (kl * mask).sum() / n_tok if kl is not None else torch.zeros((), dtype=logp.dtype),
        }
    return loss, stats


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
