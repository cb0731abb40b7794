"""The conversation warm start's batches: which transcripts each step trains on, on which rank, and as tensors.

Order: step ``s`` takes the global positions ``s * B ... s * B + B - 1`` of an endless stream of shuffled passes over
the N transcripts (pass ``e`` is a permutation seeded by ``(seed, e)``). It depends on the step alone, so a resumed
run trains on exactly the transcripts an uninterrupted one would, and no batch-order state needs saving. Rank ``r``
of ``W`` takes every W-th of a step's transcripts (``r, r + W, ...``): the ranks together cover the step's batch, and
the summed gradient is the one-process gradient.

Tensors (:func:`pack_rows`): transcripts share a long start (the system prompt that lists the tools, hundreds of
tokens). The longest start every row of a micro-batch shares becomes the "prompt" of
:func:`~lit_fgrpo.models.logprobs.completion_logprobs`, which runs it through the decoder once for all rows
(:mod:`~lit_fgrpo.models.prompt_sharing`); the rest of each row is its "completion", right-padded, with the loss mask
on the assistant's tokens. The shared start never reaches the first trained token, so every trained token is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import Tensor

from lit_fgrpo.environments.transcripts import TranscriptTokens
from lit_fgrpo.training.micro_batches import budget_chunks

_PASS_STREAM = 0x5F7
"""Mixed into each pass's seed, so that the order is not the seed's first permutation elsewhere in the library."""


@lru_cache(maxsize=8)
def pass_order(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    """The permutation of ``n`` transcripts for pass ``epoch``."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7_919 + _PASS_STREAM) % 2**63)
    return tuple(torch.randperm(n, generator=generator).tolist())


def step_rows(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """The transcripts of 0-based step ``step`` (global, every rank's): ``batch_size`` positions of the stream."""
    rows = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, n)
        rows.append(pass_order(seed, epoch, n)[offset])
    return rows


def rank_share(rows: Sequence[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s part of a step's transcripts: every ``world``-th, starting at its own index."""
    return list(rows[rank::world])


def micro_batches(
    rows: Sequence[int], size: int, lengths: Sequence[int] | None = None, max_tokens: int | None = None
) -> list[list[int]]:
    """Consecutive runs of at most ``size`` rows and, with ``max_tokens``, at most that many padded tokens
    (``count x`` the longest of ``lengths``, each row's tokens; a longer row goes alone)."""
    if max_tokens is None:
        return [list(rows[i : i + size]) for i in range(0, len(rows), size)]
    if lengths is None or len(lengths) != len(rows):
        raise ValueError("micro_batches: max_tokens needs one length per row")
    zeros = torch.zeros(len(rows), dtype=torch.long)  # no separate prompt: a transcript is counted whole
    chunks = budget_chunks(torch.tensor(list(rows)), torch.tensor(list(lengths)), zeros, size, max_tokens)
    return [chunk.tolist() for chunk in chunks]


def shared_start(rows: Sequence[TranscriptTokens]) -> int:
    """Tokens every row starts with, up to (not including) the first trained token of any row."""
    ids = [row.ids for row in rows]
    first_trained = min(len(row.prompt_ids) + row.loss_mask.index(1) for row in rows)
    length = 0
    while length < first_trained and all(len(r) > length and r[length] == ids[0][length] for r in ids):
        length += 1
    return length


def pack_rows(rows: Sequence[TranscriptTokens], pad_token_id: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """Rows as ``completion_logprobs`` reads them: the shared start, then each row's rest right-padded.

    Returns:
        ``input_ids`` (b, S + T), ``attention_mask`` (b, S + T), ``loss_mask`` (b, T) float, 1 on assistant tokens,
        and T (S: :func:`shared_start`, at least 1 so that a position predicts the first completion token).
    """
    start = max(shared_start(rows), 1)
    rests = [row.ids[start:] for row in rows]
    masks = [([0] * len(row.prompt_ids) + row.loss_mask)[start:] for row in rows]
    T = max(len(rest) for rest in rests)
    b = len(rows)
    input_ids = torch.full((b, start + T), pad_token_id, dtype=torch.long)  # (b, S + T)
    attention = torch.zeros(b, start + T, dtype=torch.long)  # (b, S + T)
    loss_mask = torch.zeros(b, T)  # (b, T)
    for r, (row, rest, mask) in enumerate(zip(rows, rests, masks)):
        input_ids[r, :start] = torch.tensor(row.ids[:start])
        input_ids[r, start : start + len(rest)] = torch.tensor(rest)
        attention[r, : start + len(rest)] = 1
        loss_mask[r, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return input_ids, attention, loss_mask, T


__all__ = ["micro_batches", "pack_rows", "pass_order", "rank_share", "shared_start", "step_rows"]
