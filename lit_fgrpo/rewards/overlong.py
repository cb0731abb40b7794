"""DAPO's overlong reward shaping (soft length penalty)."""

from __future__ import annotations

from typing import Any


class OverlongPenalty:
    """Reward function ``factor * R_len`` from the ``completion_length`` column (token counts).

    With ``L = max_completion_length`` and ``C = cache_length`` (DAPO, eq. 13):
    ``R_len = 0`` for ``len <= L - C``; ``((L - C) - len) / C`` for ``L - C < len <= L``; ``-1`` for ``len > L``.

    Args:
        max_completion_length: L_max, the longest allowed completion in tokens.
        cache_length: L_cache, the soft-penalty band below L_max (``0 < cache_length <= max_completion_length``).
        factor: Scale of the penalty.
    """

    __name__ = "overlong_penalty"

    def __init__(self, max_completion_length: int, cache_length: int, factor: float = 1.0) -> None:
        if max_completion_length < 1:
            raise ValueError(f"overlong_penalty.max_completion_length must be >= 1, got {max_completion_length}")
        if not 0 < cache_length <= max_completion_length:
            raise ValueError(
                f"overlong_penalty.cache_length must be in (0, {max_completion_length}], got {cache_length}"
            )
        self.max_completion_length = max_completion_length
        self.cache_length = cache_length
        self.factor = factor

    def penalty(self, length: int) -> float:
        """``factor * R_len`` for one completion of ``length`` tokens."""
        expected = self.max_completion_length - self.cache_length
        if length <= expected:
            return 0.0
        if length <= self.max_completion_length:
            return self.factor * (expected - length) / self.cache_length
        return -self.factor

    def __call__(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
        if "completion_length" not in columns:
            raise KeyError("overlong_penalty needs a 'completion_length' column (completion token counts)")
        return [self.penalty(int(length)) for length in columns["completion_length"]]

    def __repr__(self) -> str:
        return (
            f"overlong_penalty(max_completion_length={self.max_completion_length}, "
            f"cache_length={self.cache_length}, factor={self.factor})"
        )


def overlong_penalty(max_completion_length: int, cache_length: int, factor: float = 1.0) -> OverlongPenalty:
    """DAPO's overlong penalty as a reward function (see :class:`OverlongPenalty`)."""
    return OverlongPenalty(max_completion_length, cache_length, factor)
