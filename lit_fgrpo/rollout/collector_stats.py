"""How the collector's statistics (:attr:`~lit_fgrpo.rollout.batch.RolloutBatch.stats`) add up: over the rounds of
dynamic sampling into one batch (:func:`merge_round_stats`), and over the ranks of a step into the logged
``rollout/*`` values (the rules :data:`SUMMED_STATS` and :data:`RECOMPUTED_RATES`, which the training step's
statistics apply to every rank's stats).

Seconds and counts (generated tokens, unscorable rows, failed reward calls, dynamic sampling's prompts and groups)
add up; rates and means are averaged. Dynamic sampling's keep rate, informative groups per generated prompt, is
recomputed from the summed counts instead (:func:`keep_rate`), because ranks generate different numbers of prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lit_fgrpo.rollout.batch import RolloutBatch

EPISODE_COUNTS = ("episodes_truncated", "environment_errors")
"""Multi-turn episodes' counts (:func:`lit_fgrpo.environments.episode_stats`): they add up over rounds and ranks."""

SUMMED_PREFIXES = ("failed_", "tool_calls")
"""Counts by name prefix (failed reward calls per function; tool calls valid, invalid, by kind and per tool): they
add up over rounds and ranks."""

ROUND_COUNTS = ("reward_nonfinite", "reward_timeouts", "reward_wrong_length", "generated_tokens", *EPISODE_COUNTS)
"""Counts that add up over the rounds of dynamic sampling (with every ``*_seconds`` and :data:`SUMMED_PREFIXES`
statistic)."""

SUMMED_STATS: tuple[str, ...] = (
    "tokens_per_s",
    "generated_tokens",
    "dynamic_prompts_drawn",
    "dynamic_prompts_skipped",
    "dynamic_groups_informative",
    "dynamic_groups_kept",
    "dynamic_groups_padded",
    *EPISODE_COUNTS,
)
"""Statistics that add up over ranks (throughput, counts); :data:`SUMMED_PREFIXES` counts add up too, the rest are means
(ranks hold equally many rows, so the mean of per-rank rates is the global rate) or :data:`RECOMPUTED_RATES`."""


def keep_rate(groups_informative: float, prompts_drawn: float, prompts_skipped: float) -> float:
    """Informative groups per generated prompt (prompts consumed without generation do not count)."""
    return groups_informative / max(prompts_drawn - prompts_skipped, 1)


def merge_round_stats(batches: Sequence[RolloutBatch]) -> dict[str, float]:
    """Seconds and counts of unscorable rows add up over rounds; any other statistic is averaged, weighted by rows."""
    rows = [b.input_ids.shape[0] for b in batches]
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for b in batches for k in b.stats):
        present = [(b.stats[key], n) for b, n in zip(batches, rows, strict=True) if key in b.stats]
        if key.endswith("_seconds") or key.startswith(SUMMED_PREFIXES) or key in ROUND_COUNTS:
            out[key] = float(sum(v for v, _ in present))
        else:
            out[key] = float(sum(v * n for v, n in present) / max(sum(n for _, n in present), 1))
    return out


RECOMPUTED_RATES: dict[str, tuple[Callable[..., float], tuple[str, ...]]] = {
    "dynamic_keep_rate": (
        keep_rate,
        ("dynamic_groups_informative", "dynamic_prompts_drawn", "dynamic_prompts_skipped"),
    ),
}
"""Rates recomputed over ranks from the summed counts they are made of: ``rate: (fn, counts)``, logged as
``fn(*summed counts)`` when the rate and its first count are there (a missing later count is 0)."""
