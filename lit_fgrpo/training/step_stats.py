"""The statistics logged after each training step (``train/*``, ``rollout/*``, ``focal/*``), over every rank.

:func:`step_stats` is what the update calls, once per step. The statistics themselves are pure functions of the
rollout and the loss pieces (:func:`rollout_stats`, :func:`train_stats`, :func:`mismatch_stat`). Each rank holds
P / W prompt groups, so its own reward mean, success rate, share of active groups or smallest focal weight is not
the run's. :func:`global_rollout_stats` gathers the few small per-group tensors of every rank (rewards, advantages:
(P, G) each, group weights and success rates (P,), plus row lengths) through the update's
:class:`~lit_fgrpo.training.update_handles.Collectives` and computes the statistics once on the whole global batch,
with the same function one process uses: the logged numbers are the same on 1 rank or 16. The collector's own
statistics combine by the rules the rollout side declares (:mod:`lit_fgrpo.rollout.collector_stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_fgrpo.objectives.advantages import GroupAdvantages
from lit_fgrpo.objectives.mismatch import logprob_mismatch
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.collector_stats import RECOMPUTED_RATES, SUMMED_PREFIXES, SUMMED_STATS

Gather = Callable[[Any], list[Any]]
"""``gather(obj)``: every rank's ``obj`` in rank order (:meth:`~lit_fgrpo.training.update_handles.Collectives.gather`)."""


def step_stats(
    pieces: Sequence[dict[str, Tensor]],
    rollout: RolloutBatch,
    grouped: GroupAdvantages,
    old_logp: Tensor | None,
    gather: Gather,
    *,
    num_steps: int,
    tokens_per_s: float,
    nonfinite_skips: int,
) -> dict[str, float]:
    """Every statistic of one training step: :func:`train_stats` of the loss pieces, :func:`global_rollout_stats`
    over all ranks (a collective: every rank calls this once per step) and :func:`mismatch_stat`.

    Args:
        pieces: the loss pieces of every micro-batch of the step.
        rollout: this rank's rollout, as trained on (its tensors on the training device).
        grouped: its advantages, group weights and success rates as trained on.
        old_logp: (B, T) stored old log-probs, None when the step computed none (one pass, one optimizer step).
        gather: the update's gather over ranks.
        num_steps: optimizer steps of the training step (passes x mini-batches).
        tokens_per_s: trained tokens per second of forward, backward and optimizer time.
        nonfinite_skips: optimizer steps the non-finite guard skipped so far in the run.
    """
    values = train_stats(pieces, num_steps, tokens_per_s)
    values["train/nonfinite_skips"] = float(nonfinite_skips)
    values |= global_rollout_stats(rollout, grouped, gather)
    return values | mismatch_stat(pieces, old_logp, rollout.sampling_logp, rollout.completion_mask)


def global_rollout_stats(rollout: RolloutBatch, grouped: GroupAdvantages, gather: Gather) -> dict[str, float]:
    """:func:`rollout_stats` of the global batch plus the collector's statistics over all ranks.

    A collective under DDP: every rank must call it once per training step.

    Args:
        rollout: This rank's rollout.
        grouped: This rank's advantages as trained on, with the group weights and success rates they were built
            from (:func:`~lit_fgrpo.objectives.weighted_group_advantages`): nothing is computed a second time.
        gather: Every rank's object in rank order (``[obj]`` in one process).
    """
    local: dict[str, Any] = {
        "rewards": rollout.rewards.detach().cpu(),  # (P, G)
        "advantages": grouped.advantages.detach().cpu(),  # (P, G)
        "weights": grouped.weights.detach().cpu(),  # (P,)
        "success_rate": grouped.success_rate.detach().cpu(),  # (P,)
        "lengths": rollout.completion_mask.sum(dim=1).cpu(),  # (B,)
        "stats": dict(rollout.stats),
    }
    parts = gather(local)
    keys = ("rewards", "advantages", "weights", "success_rate")
    rewards, advs, weights, success_rate = (torch.cat([p[key] for p in parts]) for key in keys)
    lengths = torch.cat([p["lengths"] for p in parts])  # (B_global,)
    # rollout_stats only sums its mask per row: a (B, 1) column of lengths gives the same lengths
    values = rollout_stats(rewards, advs, weights, success_rate, lengths.unsqueeze(1))
    return values | combine_collector_stats([p["stats"] for p in parts])


def combine_collector_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """``rollout/<key>`` of every rank's collector statistics: :data:`~lit_fgrpo.rollout.collector_stats.SUMMED_STATS`
    and the counts named by :data:`~lit_fgrpo.rollout.collector_stats.SUMMED_PREFIXES` (``failed_*``, ``tool_calls*``)
    summed, :data:`~lit_fgrpo.rollout.collector_stats.RECOMPUTED_RATES` recomputed from the summed counts, the others
    (rates and means) averaged."""
    keys = sorted({key for stats in per_rank for key in stats})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(stats[key]) for stats in per_rank if key in stats]
        summed = key.startswith(SUMMED_PREFIXES) or key in SUMMED_STATS
        out[f"rollout/{key}"] = sum(values) if summed else sum(values) / len(values)
    for rate, (fn, counts) in RECOMPUTED_RATES.items():
        if f"rollout/{rate}" in out and f"rollout/{counts[0]}" in out:
            out[f"rollout/{rate}"] = fn(*(out.get(f"rollout/{count}", 0.0) for count in counts))
    return out


def rollout_stats(
    rewards: Tensor, advantages: Tensor, weights: Tensor, success_rate: Tensor, completion_mask: Tensor
) -> dict[str, float]:
    """``rollout/*`` and ``focal/*`` statistics of one rollout batch.

    Args:
        rewards: (P, G) rewards, NaN where unscorable.
        advantages: (P, G) advantages as trained on (a group is active when any advantage is non-zero).
        weights: (P,) the group weights the advantages were multiplied by; ``focal/weight_*`` are their mean and
            minimum over the active groups.
        success_rate: (P,) each group's mu_hat (both as :func:`~lit_fgrpo.objectives.weighted_group_advantages`
            returns them).
        completion_mask: (B, T) trained completion tokens.

    ``rollout/frac_all_correct`` and ``rollout/frac_all_wrong`` are the shares of groups with mu_hat = 1 and 0 (the
    groups GRPO cannot learn from); ``focal/weight_median`` is the median weight of the active groups. (The sampling
    cost of a step is the collector's ``rollout/generated_tokens``.)
    """
    valid = ~torch.isnan(rewards)  # (P, G)
    active = (advantages != 0).any(dim=1)  # (P,)
    mu_hat = success_rate  # (P,)
    lengths = completion_mask.sum(dim=1)  # (B,)
    return {
        "rollout/reward_mean": float(torch.nanmean(rewards)),
        "rollout/reward_std": float(rewards[valid].std()) if valid.sum() > 1 else 0.0,
        "rollout/success_rate": float(mu_hat.mean()),
        "rollout/frac_active_groups": float(active.float().mean()),
        "rollout/completion_length": float(lengths.mean()),
        "rollout/frac_all_correct": float((mu_hat == 1).float().mean()),
        "rollout/frac_all_wrong": float((mu_hat == 0).float().mean()),
        "focal/weight_median": float(weights[active].median()) if active.any() else 1.0,
        "focal/weight_mean": float(weights[active].mean()) if active.any() else 1.0,
        "focal/weight_min": float(weights[active].min()) if active.any() else 1.0,
    }


def train_stats(pieces: Sequence[dict[str, Tensor]], num_steps: int, tokens_per_s: float) -> dict[str, float]:
    """``train/*`` statistics from the loss pieces of every micro-batch of one training step.

    Each piece holds ``loss`` (already scaled by its share), ``tokens`` and the token means of
    :func:`~lit_fgrpo.objectives.policy_loss` (``clip_frac*``, ``ratio_mean``, ``kl``), plus ``entropy_sum``;
    token means are re-weighted by each piece's tokens (``entropy_sum`` by the tokens of the pieces that have it:
    those of the first pass). ``train/loss`` is the mean over optimizer steps.
    """
    tokens = sum(float(s["tokens"]) for s in pieces)
    # the entropy is computed on the first pass only (pieces of later passes have no entropy_sum)
    entropy_sum = sum(float(s["entropy_sum"]) for s in pieces if "entropy_sum" in s)
    entropy_tokens = sum(float(s["tokens"]) for s in pieces if "entropy_sum" in s)
    loss = float(torch.stack([s["loss"] for s in pieces]).sum()) if pieces else 0.0

    def token_mean(key: str) -> float:
        if not pieces or tokens == 0:
            return 0.0
        return sum(float(s[key]) * float(s["tokens"]) for s in pieces) / tokens

    return {
        "train/loss": loss / num_steps,
        "train/clip_frac": token_mean("clip_frac"),
        "train/clip_frac_low": token_mean("clip_frac_low"),
        "train/clip_frac_high": token_mean("clip_frac_high"),
        "train/ratio_mean": token_mean("ratio_mean"),
        "train/kl": token_mean("kl"),
        "train/entropy": entropy_sum / entropy_tokens if entropy_tokens else 0.0,
        "train/tokens_per_s": tokens_per_s,
    }


def mismatch_stat(
    pieces: Sequence[dict[str, Tensor]],
    train_old: Tensor | None,
    sampling_logp: Tensor | None,
    completion_mask: Tensor,
) -> dict[str, float]:
    """``rollout/logprob_mismatch``: mean |trainer - engine| log-prob gap, or {} when it cannot be measured.

    With stored old log-probs (B, T) it is computed on them; in one pass/one step it was summed per piece
    (``mismatch_sum``) from the live log-probs, which are then the behaviour policy's.
    """
    if train_old is not None and sampling_logp is not None:
        return {"rollout/logprob_mismatch": float(logprob_mismatch(train_old, sampling_logp, completion_mask))}
    tokens = sum(float(s["tokens"]) for s in pieces)
    if tokens and all("mismatch_sum" in s for s in pieces):
        return {"rollout/logprob_mismatch": sum(float(s["mismatch_sum"]) for s in pieces) / tokens}
    return {}
