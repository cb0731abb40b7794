"""A resumable, sharded stream of prompt batches.

Infinite mode reads a global sequence: epoch ``e`` is a permutation of the records drawn from ``(seed, e)``, and the
epochs follow each other without gaps. With ``W`` ranks of ``batch_size`` prompts each, the global batch ``t`` is
the global positions ``[t * P, (t + 1) * P)`` with ``P = batch_size * W`` (the configured, global
``prompts_per_step``), whatever ``W`` is; rank ``r`` takes the strided slice ``batch[r::W]`` of it, i.e. positions
``r, r + W, r + 2W, ...``. The strided slice (rather than a contiguous one) keeps mini-batches global too: the
first ``m`` prompts of every rank together are the first ``m * W`` prompts of the global batch, so a global
``mini_batch_prompts`` splits the global batch the same way on 1 rank or 16. Each record is seen exactly once per
epoch across ranks, and after ``b`` batches on every rank exactly the first ``b * P`` global positions have been
read. Every yielded record carries its global position (:attr:`PromptRecord.position`), from which its sampling
seed derives (:func:`lit_fgrpo.distributed.prompt_seed`). Batches (not records) are dealt to dataloader workers
round robin, which is the order in which ``DataLoader`` collects them, so the batch sequence of a rank does not
depend on ``num_workers`` and a resume point is one number: the next batch index.

Single-pass mode (evaluation) reads the records in source order; rank ``r`` takes ``records[r::W]`` and a record's
position is its index in the split.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from lit_fgrpo.data.records import PromptRecord
from lit_fgrpo.errors import CheckpointError

log = logging.getLogger(__name__)


class PromptStream(IterableDataset):
    """Batches of :class:`PromptRecord` (``list[PromptRecord]``), sharded by rank and dataloader worker.

    Use it with ``DataLoader(stream, batch_size=None, collate_fn=...)``: the stream forms the batches itself.

    Resume semantics: :attr:`next_batch` (per rank) is where the next ``iter()`` starts. With ``count_yielded=True``
    the stream advances it for every batch it yields in the main process, which is right when you iterate it
    yourself. Behind a ``DataLoader`` with workers, or under Lightning (which fetches one batch ahead), the consumer
    should pass ``count_yielded=False`` and advance :attr:`next_batch` when a batch is really used, as
    :class:`~lit_fgrpo.data.datamodule.PromptDataModule` does.

    Args:
        records: The prompts.
        batch_size: Prompts per batch on one rank (the global count divided by ``world_size``, see
            :func:`lit_fgrpo.distributed.per_rank_share`).
        infinite: Loop over reshuffled epochs forever; otherwise one pass in source order from the start at
            every ``iter()`` (for evaluation; no resume point), the last batch possibly short.
        shuffle: Reshuffle every epoch (infinite mode only).
        seed: Seed of the per-epoch permutations.
        rank: Global rank of this process.
        world_size: Number of ranks.
        count_yielded: Advance :attr:`next_batch` for each batch yielded in the main process.
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        batch_size: int,
        *,
        infinite: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        count_yielded: bool = True,
    ) -> None:
        if not records:
            raise ValueError("PromptStream needs at least one record")
        if batch_size < 1:
            raise ValueError(f"PromptStream.batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"PromptStream needs 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.records = list(records)
        self.batch_size = batch_size
        self.infinite = infinite
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.count_yielded = count_yielded
        self.next_batch = 0
        """Per-rank index of the next batch to hand out (the resume point)."""
        self._permutations: dict[int, np.ndarray] = {}

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            if len(self._permutations) > 4:
                self._permutations.clear()
            n = len(self.records)
            rng = np.random.default_rng([self.seed, epoch])
            self._permutations[epoch] = rng.permutation(n) if self.shuffle else np.arange(n)
        return self._permutations[epoch]

    def _record_at(self, global_position: int) -> PromptRecord:
        epoch, offset = divmod(global_position, len(self.records))
        return replace(self.records[int(self._permutation(epoch)[offset])], position=global_position)

    def positions(self, batch_index: int) -> list[int]:
        """Global positions of batch ``batch_index`` of this rank (``batch[rank::world_size]`` of the global batch)."""
        first = batch_index * self.batch_size
        if self.infinite:
            return self.sequence_positions(first, self.batch_size)
        shard = range(self.rank, len(self.records), self.world_size)
        return list(shard[first : first + self.batch_size])

    def sequence_positions(self, first: int, count: int) -> list[int]:
        """Global positions of this rank's records ``first, ..., first + count - 1`` of the infinite sequence."""
        return [k * self.world_size + self.rank for k in range(first, first + count)]

    def records_at(self, first: int, count: int) -> list[PromptRecord]:
        """This rank's records ``first .. first + count - 1`` of the infinite sequence (any count; infinite mode).

        The per-rank record index of batch ``b`` is ``b * batch_size``; dynamic sampling reads the sequence with
        its own cursor through this (see :meth:`lit_fgrpo.data.PromptDataModule.draw_prompts`).
        """
        if not self.infinite:
            raise ValueError("PromptStream.records_at reads the infinite (training) sequence only")
        return [self._record_at(position) for position in self.sequence_positions(first, count)]

    def batch(self, batch_index: int) -> list[PromptRecord]:
        """Batch number ``batch_index`` of this rank (empty past the end in single-pass mode)."""
        if self.infinite:
            return [self._record_at(position) for position in self.positions(batch_index)]
        return [replace(self.records[position], position=position) for position in self.positions(batch_index)]

    def num_batches(self) -> int | None:
        """Batches per pass on this rank in single-pass mode; ``None`` when infinite.

        Deliberately not ``__len__``: Lightning warns about a sized ``IterableDataset`` on every run.
        """
        if self.infinite:
            return None
        shard_size = len(range(self.rank, len(self.records), self.world_size))
        return -(-shard_size // self.batch_size)

    def __iter__(self) -> Iterator[list[PromptRecord]]:
        worker = get_worker_info()
        num_workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        total = self.num_batches()
        batch_index = (0 if total is not None else self.next_batch) + worker_id
        while total is None or batch_index < total:
            yield self.batch(batch_index)
            if self.count_yielded and worker is None and total is None:
                self.next_batch = batch_index + 1
            batch_index += num_workers

    @property
    def epoch_and_position(self) -> tuple[int, int]:
        """(epoch, offset within the epoch) of the next global position to read, taken over all ranks."""
        return divmod(self.next_batch * self.batch_size * self.world_size, len(self.records))

    def state_dict(self) -> dict[str, Any]:
        """The resume point, plus what it depends on."""
        epoch, position = self.epoch_and_position
        return {
            "epoch": epoch,
            "position": position,
            "next_batch": self.next_batch,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "num_records": len(self.records),
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved resume point.

        With the same records, seed, batch size and world size the continuation is exact. If the batch size or
        world size changed, the stream restarts at the first batch boundary at or after the saved global
        position (at most one batch per rank is skipped) and logs a warning.

        Raises:
            CheckpointError: If the number of records or the seed differs (the saved position would be meaningless).
        """
        for key, current in (("num_records", len(self.records)), ("seed", self.seed)):
            if state.get(key, current) != current:
                raise CheckpointError(f"cannot resume the prompt stream: saved {key}={state[key]}, now {current}")
        if state.get("batch_size") == self.batch_size and state.get("world_size") == self.world_size:
            self.next_batch = int(state["next_batch"])
            return
        global_position = int(state["epoch"]) * len(self.records) + int(state["position"])
        per_batch = self.batch_size * self.world_size
        self.next_batch = -(-global_position // per_batch)
        log.warning(
            "prompt stream resumed with batch_size=%d, world_size=%d (saved %s, %s): continuing at the next batch "
            "boundary, global position %d",
            self.batch_size,
            self.world_size,
            state.get("batch_size"),
            state.get("world_size"),
            self.next_batch * per_batch,
        )
