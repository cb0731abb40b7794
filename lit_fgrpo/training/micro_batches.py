"""Cutting a mini-batch into micro-batches for the training pass: which rows, in what order, how wide.

Every loss is row-local and each piece's aggregation share depends on row counts only
(:mod:`lit_fgrpo.objectives.loss_types`), so none of this changes the gradient; it only changes how much padding
goes through the model:

* rows whose advantage is 0 are left out when they cannot contribute (no KL term): their loss and gradient are 0;
* rows are sorted by completion length (stably), so a micro-batch holds rows of similar length;
* each micro-batch is cut to its own longest completion (``width``), and :func:`trim_rows` drops the prompt
  columns that are padding in every row of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward of the training pass."""

    rows: Tensor
    """(b,) row indices into the rollout."""
    width: int
    """Completion columns kept: the longest completion among ``rows`` (>= 1)."""
    padding: bool = False
    """A zero-loss backward that only keeps DDP's gradient all-reduces in step (see :func:`padding_micro_batches`)."""


def plan_micro_batches(
    rows: Tensor, advantages: Tensor, lengths: Tensor, micro_batch_rows: int, skip_zero_advantage: bool
) -> list[MicroBatch]:
    """The micro-batches of the mini-batch ``rows``.

    Args:
        rows: (R,) the mini-batch's row indices.
        advantages: (B,) every row's advantage.
        lengths: (B,) every row's completion tokens.
        micro_batch_rows: most rows per micro-batch.
        skip_zero_advantage: leave out rows whose advantage is exactly 0 (only valid without a KL term).
    """
    if skip_zero_advantage:
        rows = rows[advantages[rows] != 0]  # (R',)
    if len(rows) == 0:
        return []
    rows = rows[torch.argsort(lengths[rows], stable=True)]  # (R',) shortest completions first
    return [MicroBatch(chunk, max(1, int(lengths[chunk].max()))) for chunk in rows.split(micro_batch_rows)]


def padding_micro_batches(row: Tensor, count: int) -> list[MicroBatch]:
    """``count`` zero-loss micro-batches of one row: DDP all-reduces gradients in every backward, so a rank with
    fewer micro-batches (its rows skipped) runs these until it has as many as the busiest rank."""
    return [MicroBatch(row[:1], 1, padding=True) for _ in range(count)]


def trim_rows(input_ids: Tensor, attention_mask: Tensor, completion_length: int, width: int) -> tuple[Tensor, Tensor]:
    """Rows cut to their first ``width`` completion columns and without the prompt's leading columns that are
    padding in every row (left-padded prompts): the log-probs of the kept tokens are unchanged.

    Args:
        input_ids: (b, Tp + T) prompt then completion ids.
        attention_mask: (b, Tp + T).
        completion_length: T.
        width: completion columns to keep (<= T).

    Returns:
        ``(input_ids, attention_mask)``, each (b, Tp' + width).
    """
    prompt_width = input_ids.shape[1] - completion_length
    first = int(attention_mask[:, :prompt_width].any(dim=0).long().argmax()) if prompt_width > 0 else 0
    end = prompt_width + width
    return input_ids[:, first:end], attention_mask[:, first:end]  # (b, Tp' + width)
