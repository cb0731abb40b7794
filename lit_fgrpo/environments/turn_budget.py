"""Fitting the environment's messages into what is left of an episode's token budget.

A tool result longer than the room left is cut, with a visible marker, rather than dropped with the episode: the
model still reads the start of it and knows that more was there (``[... cut: 1234 more characters]``).
"""

from __future__ import annotations

from collections.abc import Sequence

from lit_fgrpo.environments.turns import ChatTurns

CUT_MARKER = "\n[... cut: {} more characters]"
"""Appended to a message whose content was cut to fit the episode's budget."""

_ROUNDS = 8


def fit_messages(
    turns: ChatTurns, messages: Sequence[dict[str, str]], budget: int
) -> tuple[list[dict[str, str]], list[int]] | None:
    """``messages`` and their token ids (:meth:`ChatTurns.suffix_ids`) within ``budget`` tokens, each message's content
    cut in proportion (with :data:`CUT_MARKER`) when they do not fit whole.

    Returns:
        The messages as they go into the conversation and their ids, or ``None`` when not even the turn markers fit.

    Raises:
        EnvironmentFault: If the chat template fails to render them (from :meth:`ChatTurns.suffix_ids`).
    """
    fitted = [dict(m) for m in messages]
    ids = turns.suffix_ids(fitted)
    if len(ids) <= budget:
        return fitted, ids
    bare = turns.suffix_ids([m | {"content": CUT_MARKER.format(len(m["content"]))} for m in fitted])
    if len(bare) > budget:
        return None
    originals = [m["content"] for m in messages]
    share = (budget - len(bare)) / max(len(ids) - len(bare), 1)
    for _ in range(_ROUNDS):
        for message, original in zip(fitted, originals):
            keep = int(len(original) * share)
            message["content"] = original[:keep] + CUT_MARKER.format(len(original) - keep)
        ids = turns.suffix_ids(fitted)
        if len(ids) <= budget:
            return fitted, ids
        share *= 0.75
    for message, original in zip(fitted, originals):
        message["content"] = CUT_MARKER.format(len(original))
    return fitted, bare
