"""What a researcher sees per step of multi-turn episodes (logged under ``rollout/``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lit_fgrpo.environments.episode import Episode

FAULT_KINDS = ("constructor", "reset", "step", "get_reward", "timeout", "template", "worker", "routing", "other")
"""The kinds of environment faults, each counted every step (0 when none)."""
INVALID_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "tool_exception")
"""Why a call was answered with an error message instead of a result."""


def episode_stats(episodes: Sequence[Episode], tools: Sequence[str] = ()) -> dict[str, float]:
    """Per-step statistics of ended episodes.

    ``turns_per_episode`` (mean); ``tool_calls_valid`` and ``tool_calls_invalid`` (totals, the invalid ones also by
    kind: ``tool_calls_malformed``, ..., ``tool_calls_tool_exception``); ``tool_calls/<tool>`` and
    ``tool_errors/<tool>`` for every tool (0 when never called: a run that "succeeds" without its tool shows it);
    ``episodes_truncated``; ``environment_errors`` and ``environment_errors/<kind>`` for every kind of
    :data:`FAULT_KINDS` (counts); ``environment_tokens`` (mean environment tokens per episode).
    """
    count = max(len(episodes), 1)
    valid: Counter[str] = Counter(dict.fromkeys(tools, 0))
    errors: Counter[str] = Counter(dict.fromkeys(tools, 0))
    invalid: Counter[str] = Counter(dict.fromkeys(INVALID_KINDS, 0))
    faults: Counter[str] = Counter(dict.fromkeys(FAULT_KINDS, 0))
    for episode in episodes:
        valid.update(episode.tool_calls)
        errors.update(episode.tool_errors)
        invalid.update(episode.invalid_calls)
        if episode.unscorable is not None:
            faults[episode.fault_kind or "other"] += 1
    stats = {
        "turns_per_episode": sum(e.turns for e in episodes) / count,
        "tool_calls_valid": float(sum(valid.values())),
        "tool_calls_invalid": float(sum(invalid.values())),
        "episodes_truncated": float(sum(e.truncated for e in episodes)),
        "environment_errors": float(sum(faults.values())),
        "environment_tokens": sum(len(s.ids) for e in episodes for s in e.segments if not s.trained) / count,
    }
    stats |= {f"tool_calls_{kind}": float(n) for kind, n in invalid.items()}
    stats |= {f"tool_calls/{name}": float(n) for name, n in sorted(valid.items())}
    stats |= {f"tool_errors/{name}": float(n) for name, n in sorted(errors.items())}
    stats |= {f"environment_errors/{kind}": float(n) for kind, n in faults.items()}
    return stats
