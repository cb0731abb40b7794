"""The logged ``rollout/*`` and ``focal/*`` statistics of a training step over every rank's groups.

Each rank holds P / W prompt groups, so its own reward mean, success rate, share of active groups or smallest focal
weight is not the run's. :func:`global_rollout_stats` gathers the few small per-group tensors of every rank (rewards,
verdicts, advantages: (P, G) each, plus row lengths) and computes the statistics once on the whole global batch, with
the same function one process uses: the logged numbers are the same on 1 rank or 16.
"""

from __future__ import annotations

from typing import Any

import torch

from lit_fgrpo.distributed.reduction import gather_objects
from lit_fgrpo.objectives.advantages import GroupAdvantages
from lit_fgrpo.objectives.diagnostics import rollout_stats
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.group_filter import keep_rate

SUMMED_STATS = (
    "tokens_per_s",
    "generated_tokens",
    "dynamic_prompts_drawn",
    "dynamic_prompts_skipped",
    "dynamic_groups_informative",
    "dynamic_groups_kept",
    "dynamic_groups_padded",
)
"""Collector statistics that add up over ranks (throughput, counts); ``failed_*`` counts add up too, the rest are
means."""


def combine_collector_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """``rollout/<key>`` of the collector's statistics: counts and throughput summed, rates and means averaged.

    Ranks hold equally many rows, so the mean of per-rank rates is the global rate. Dynamic sampling's keep rate
    (informative groups per generated prompt) is the exception: ranks generate different numbers of prompts, so it
    is recomputed from the summed counts.
    """
    keys = sorted({key for stats in per_rank for key in stats})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(stats[key]) for stats in per_rank if key in stats]
        summed = key.startswith("failed_") or key in SUMMED_STATS
        out[f"rollout/{key}"] = sum(values) if summed else sum(values) / len(values)
    if "rollout/dynamic_keep_rate" in out and "rollout/dynamic_groups_informative" in out:
        out["rollout/dynamic_keep_rate"] = keep_rate(
            out["rollout/dynamic_groups_informative"],
            out["rollout/dynamic_prompts_drawn"],
            out.get("rollout/dynamic_prompts_skipped", 0.0),
        )
    return out


def global_rollout_stats(rollout: RolloutBatch, grouped: GroupAdvantages) -> dict[str, float]:
    """:func:`~lit_fgrpo.objectives.diagnostics.rollout_stats` of the global batch plus the collector's statistics.

    A collective under DDP: every rank must call it once per training step.

    Args:
        rollout: This rank's rollout.
        grouped: This rank's advantages as trained on, with the group weights and success rates they were built
            from (:func:`~lit_fgrpo.objectives.weighted_group_advantages`): nothing is computed a second time.
    """
    local: dict[str, Any] = {
        "rewards": rollout.rewards.detach().cpu(),  # (P, G)
        "advantages": grouped.advantages.detach().cpu(),  # (P, G)
        "weights": grouped.weights.detach().cpu(),  # (P,)
        "success_rate": grouped.success_rate.detach().cpu(),  # (P,)
        "lengths": rollout.completion_mask.sum(dim=1).cpu(),  # (B,)
        "stats": dict(rollout.stats),
    }
    parts = gather_objects(local)
    keys = ("rewards", "advantages", "weights", "success_rate")
    rewards, advs, weights, success_rate = (torch.cat([p[key] for p in parts]) for key in keys)
    lengths = torch.cat([p["lengths"] for p in parts])  # (B_global,)
    # rollout_stats only sums its mask per row: a (B, 1) column of lengths gives the same lengths
    values = rollout_stats(rewards, advs, weights, success_rate, lengths.unsqueeze(1))
    return values | combine_collector_stats([p["stats"] for p in parts])
