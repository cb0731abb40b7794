"""Cutting a mini-batch into micro-batches for the training pass: which rows, in what order, how wide.

Every loss is row-local and each piece's aggregation share depends on row counts only
(:mod:`lit_fgrpo.objectives.loss_types`), so none of this changes the gradient; it only changes how much padding
goes through the model:

* rows whose advantage is 0 are left out when they cannot contribute (no KL term): their loss and gradient are 0;
* rows are sorted by completion length (stably), so a micro-batch holds rows of similar length;
* a micro-batch holds at most ``micro_batch_rows`` rows and, with a token budget, at most ``micro_batch_tokens``
  padded tokens (rows x (its longest prompt + its longest completion)): long multi-turn rows then go a few at a
  time and short ones many at a time (verl's ``ppo_max_token_len_per_gpu``), which bounds a forward's activations;
* each micro-batch is cut to its own longest completion (``width``), and the prompt columns that are padding in
  every row of it are dropped (:func:`kept_columns`).

:func:`plan_step` cuts a whole rollout at once: its mini-batches (one optimizer step each), their micro-batches and
each micro-batch's columns, computed once per training step and reused by every pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

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
    columns: slice | None = None
    """The input (prompt + completion) columns the forward keeps (:func:`kept_columns`); None: every column."""


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step's rows and their micro-batches."""

    rows: Tensor
    """(R,) row indices into the rollout: the mini-batch's prompts' groups, in order."""
    micro_batches: list[MicroBatch]
    """Its forward/backward passes (none when every row was left out; padding ones last)."""


def plan_micro_batches(
    rows: Tensor,
    advantages: Tensor,
    lengths: Tensor,
    micro_batch_rows: int,
    skip_zero_advantage: bool,
    prompt_lengths: Tensor | None = None,
    micro_batch_tokens: int | None = None,
) -> list[MicroBatch]:
    """The micro-batches of the mini-batch ``rows``.

    Args:
        rows: (R,) the mini-batch's row indices.
        advantages: (B,) every row's advantage.
        lengths: (B,) every row's completion tokens.
        micro_batch_rows: most rows per micro-batch.
        skip_zero_advantage: leave out rows whose advantage is exactly 0 (only valid without a KL term).
        prompt_lengths: (B,) every row's prompt tokens; needed with ``micro_batch_tokens``.
        micro_batch_tokens: most padded tokens per micro-batch, ``b x (max prompt + max completion)`` over its rows
            (a row longer than that goes alone); None: rows only.
    """
    if skip_zero_advantage:
        rows = rows[advantages[rows] != 0]  # (R',)
    if len(rows) == 0:
        return []
    rows = rows[torch.argsort(lengths[rows], stable=True)]  # (R',) shortest completions first
    if micro_batch_tokens is None:
        chunks = list(rows.split(micro_batch_rows))
    else:
        if prompt_lengths is None:
            raise ValueError("micro_batch_tokens needs prompt_lengths")
        chunks = budget_chunks(
            rows, lengths[rows].clamp(min=1), prompt_lengths[rows], micro_batch_rows, micro_batch_tokens
        )
    return [MicroBatch(chunk, max(1, int(lengths[chunk].max()))) for chunk in chunks]


def budget_chunks(rows: Tensor, widths: Tensor, prompts: Tensor, max_rows: int, max_tokens: int) -> list[Tensor]:
    """``rows`` cut in order into the longest runs that keep ``count <= max_rows`` and
    ``count x (max prompt + max width) <= max_tokens`` (greedy: each run ends where the next row would break a limit;
    a single row over the budget forms a run of its own).

    Args:
        rows: (R,) row indices, in the order to keep.
        widths: (R,) each row's completion columns (>= 1).
        prompts: (R,) each row's prompt tokens.
        max_rows: most rows per run.
        max_tokens: most padded tokens per run.
    """
    if len(rows) == 0:
        return []
    chunks: list[Tensor] = []
    start, top_width, top_prompt = 0, 0, 0
    for i, (width, prompt) in enumerate(zip(widths.tolist(), prompts.tolist(), strict=True)):
        w, p = max(top_width, width), max(top_prompt, prompt)
        if i > start and (i - start >= max_rows or (i - start + 1) * (w + p) > max_tokens):
            chunks.append(rows[start:i])
            start, w, p = i, width, prompt
        top_width, top_prompt = w, p
    chunks.append(rows[start:])
    return chunks


def padding_micro_batches(row: Tensor, count: int) -> list[MicroBatch]:
    """``count`` zero-loss micro-batches of one row: DDP all-reduces gradients in every backward, so a rank with
    fewer micro-batches (its rows skipped) runs these until it has as many as the busiest rank."""
    return [MicroBatch(row[:1], 1, padding=True) for _ in range(count)]


def plan_step(
    advantages: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    group_size: int,
    prompts_per_step: int,
    micro_batch_rows: int,
    skip_zero_advantage: bool,
    busiest: Callable[[int], int] | None = None,
    micro_batch_tokens: int | None = None,
) -> list[MiniBatch]:
    """The mini-batches of a rollout of ``B = P * G`` rows (prompt-major), each with its micro-batches and columns.

    Args:
        advantages: (B,) every row's advantage.
        attention_mask: (B, Tp + T) left-padded prompts then right-padded completions.
        completion_length: T.
        group_size: G, rows per prompt.
        prompts_per_step: prompts per mini-batch (the last one may hold fewer).
        micro_batch_rows: most rows per micro-batch.
        skip_zero_advantage: leave out rows whose advantage is exactly 0 (only valid without a KL term).
        busiest: over several ranks, the most micro-batches any rank has in a mini-batch (a collective, made once
            per mini-batch by every rank); a rank with fewer adds :func:`padding_micro_batches`. None: one rank.
        micro_batch_tokens: most padded tokens per micro-batch (see :func:`plan_micro_batches`); None: rows only.
    """
    T = completion_length
    lengths = attention_mask[:, -T:].sum(dim=1)  # (B,) completion tokens present
    prompt_lengths = attention_mask[:, :-T].sum(dim=1) if T > 0 else attention_mask.sum(dim=1)  # (B,)
    num_prompts = attention_mask.shape[0] // group_size
    plan: list[MiniBatch] = []
    for first in range(0, num_prompts, prompts_per_step):
        end = min(num_prompts, first + prompts_per_step) * group_size
        rows = torch.arange(first * group_size, end, device=advantages.device)  # (R,)
        micro = plan_micro_batches(
            rows, advantages, lengths, micro_batch_rows, skip_zero_advantage, prompt_lengths, micro_batch_tokens
        )
        if busiest is not None:  # DDP all-reduces gradients in every backward: run as many as the busiest rank
            micro += padding_micro_batches(rows, busiest(len(micro)) - len(micro))
        cut = [replace(m, columns=kept_columns(attention_mask[m.rows], T, m.width)) for m in micro]
        plan.append(MiniBatch(rows, cut))
    return plan


def kept_columns(attention_mask: Tensor, completion_length: int, width: int) -> slice:
    """The input columns rows keep: their first ``width`` completion columns, after the prompt columns that are not
    padding in every row (left-padded prompts). The log-probs of the kept tokens are unchanged.

    Args:
        attention_mask: (b, Tp + T) of the rows.
        completion_length: T.
        width: completion columns to keep (<= T).
    """
    prompt_width = attention_mask.shape[1] - completion_length
    first = int(attention_mask[:, :prompt_width].any(dim=0).long().argmax()) if prompt_width > 0 else 0
    return slice(first, prompt_width + width)


def trim_rows(input_ids: Tensor, attention_mask: Tensor, completion_length: int, width: int) -> tuple[Tensor, Tensor]:
    """Rows cut to their :func:`kept_columns`.

    Args:
        input_ids: (b, Tp + T) prompt then completion ids.
        attention_mask: (b, Tp + T).
        completion_length: T.
        width: completion columns to keep (<= T).

    Returns:
        ``(input_ids, attention_mask)``, each (b, Tp' + width).
    """
    columns = kept_columns(attention_mask, completion_length, width)
    return input_ids[:, columns], attention_mask[:, columns]  # (b, Tp' + width)
