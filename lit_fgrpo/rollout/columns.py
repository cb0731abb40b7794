"""Per-prompt record columns expanded to the per-completion lists that reward functions receive."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_fgrpo.data.records import PromptRecord


def columns_per_completion(records: Sequence[PromptRecord], num_generations: int) -> dict[str, list[Any]]:
    """Expand per-prompt columns to per-completion lists (prompt-major: row ``i * G + j``), ``None`` where absent."""
    names = sorted({name for record in records for name in record.columns})
    return {name: [record.columns.get(name) for record in records for _ in range(num_generations)] for name in names}
