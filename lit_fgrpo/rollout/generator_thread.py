"""``StalenessBoundedRollouts``: generate the next rollout batches while the trainer trains, k versions at most.

The trainer loop is ``take()`` (a batch) → train → ``push_weights(version)``. With ``max_staleness = k >= 1`` a
background thread calls ``collect_fn`` on the prompt batches ahead of the trainer (``k = 0`` is not a thread: it is
the synchronous schedule, :class:`~lit_fgrpo.rollout.sync_schedule.SyncRollouts`).

Schedule. Prompt batch ``i`` is sampled with seed ``base_seed + i``. The generator may *claim* batch ``i`` once the
trainer has taken batch ``i - k`` (``i < taken + k``), and records the policy version ``v_s`` the engine holds then.
A weight push waits until every batch allowed by that rule has been claimed and the engine is idle, then swaps the
weights; generation never overlaps a swap. With versions pushed as 0, 1, 2, ... batch ``i`` is therefore sampled at
version ``max(0, i - k)`` whatever the timing, so a run is reproducible and the staleness of a taken batch,

.. math::
    s_i = v_{\\text{take}} - v_s(i) \\le k,

is exactly ``min(i, k)``. If versions jump (a caller pushing twice per step), a batch with ``s_i > k`` is dropped,
counted (``rollout/dropped_stale``) and regenerated at the current version in the trainer's thread: never trained
on, and its prompts are not lost.

Checkpoints hold the index of the next batch to hand to the trainer. Batches generated but not yet taken are
either saved with their version (``state_dict(in_flight=True)``: the resumed run is the uninterrupted one) or
regenerated after a resume (same prompts, same seeds, the restored weights); either way no prompt is lost or
repeated. An exception in the generator thread is re-raised in the trainer's thread by the next ``take()`` or
``push_weights()``; ``close()`` stops the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lit_fgrpo.engines.base import RolloutEngine
from lit_fgrpo.errors import ConfigError

R = TypeVar("R")
"""One prompt record (``PromptRecord`` in the library)."""
B = TypeVar("B")
"""What ``collect_fn`` returns (``RolloutBatch`` in the library)."""


def check_engine_for_async(engine: RolloutEngine, max_staleness: int) -> None:
    """Refuse ``max_staleness > 0`` with an engine that samples with the trainer's own module.

    Such an engine (the HF engine, :attr:`~lit_fgrpo.engines.base.RolloutEngine.has_own_weights` False) shares the
    policy module: the optimizer would change the weights in the middle of a generation and the recorded version
    would be wrong. vLLM (its own copy) and :class:`~lit_fgrpo.engines.hf_copy.HFCopyEngine` are fine.

    Raises:
        ConfigError: naming ``max_staleness`` and the way out.
    """
    if max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
    if max_staleness > 0 and not engine.has_own_weights:
        raise ConfigError(
            f"max_staleness={max_staleness} needs an engine with its own copy of the weights, but the HF engine "
            "samples with the trainer's policy module, which the optimizer changes during generation; use the "
            "vLLM engine, the HF engine with its own weight copy (RolloutCallback.engine=hf_copy), or max_staleness=0"
        )


@dataclass
class TakenBatch(Generic[B]):
    """A batch handed to the trainer, with where it came from and how old it is."""

    batch: B
    """What ``collect_fn`` returned."""
    index: int
    """Position of the prompt batch in the source (0, 1, 2, ... across resumes)."""
    sampled_version: int
    """Policy version the engine held when it sampled the batch (the behaviour policy)."""
    staleness: int
    """Trainer version at hand-over minus ``sampled_version`` (<= max_staleness)."""
    stats: dict[str, float]
    """``rollout/staleness{,_mean,_max}``, ``rollout/dropped_stale`` (running totals), ``rollout/policy_version``,
    ``time/wait_trainer`` (this hand-over) and ``time/wait_engine`` (engine idle time since the last hand-over)."""


@dataclass
class _Ready(Generic[B]):
    batch: B
    version: int


class StalenessBoundedRollouts(Generic[R, B]):
    """Rollout batches for the trainer, generated up to ``max_staleness`` policy versions ahead.

    Args:
        collect_fn: ``collect_fn(records, seed) -> batch``; samples with the engine's current weights. Called from
            the generator thread when ``max_staleness > 0``, never while ``sync_fn`` runs.
        batch_source: ``batch_source(i)`` = the records of prompt batch ``i`` (random access, e.g.
            ``PromptStream.batch``), so a resume regenerates exactly the batches that were not trained on.
        sync_fn: pushes the trainer's current weights into the engine (called by :meth:`push_weights` unless the
            call brings its own push).
        max_staleness: k; 0 = synchronous (no thread), k >= 1 = generate up to k batches ahead.
        base_seed: batch ``i`` is sampled with seed ``base_seed + i``.
        initial_version: the version the engine holds at start (the trainer's RL step count).
    """

    def __init__(
        self,
        collect_fn: Callable[[Sequence[R], int], B],
        batch_source: Callable[[int], Sequence[R]],
        sync_fn: Callable[[], None] | None = None,
        max_staleness: int = 1,
        base_seed: int = 0,
        initial_version: int = 0,
    ) -> None:
        if max_staleness < 1:  # k = 0 is the synchronous schedule (SyncRollouts): no thread, no second path here
            raise ValueError(f"max_staleness must be >= 1 for a generator thread, got {max_staleness}")
        self.collect_fn = collect_fn
        self.batch_source = batch_source
        self.sync_fn = sync_fn
        self.max_staleness = int(max_staleness)
        self.base_seed = int(base_seed)
        self._version = int(initial_version)
        self._taken = 0  # index of the next batch handed to the trainer
        self._claimed = 0  # index of the next batch the generator samples
        self._ready: dict[int, _Ready[B]] = {}
        self._busy = False  # the engine is generating or receiving weights
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._dropped = 0
        self._staleness_sum = 0
        self._staleness_max = 0
        self._engine_wait = 0.0  # engine idle seconds since the last hand-over
        self._last_generation_end: float | None = None

    # ------------------------------------------------------------------ trainer side
    @property
    def version(self) -> int:
        """The policy version the engine holds (the last one pushed)."""
        return self._version

    @property
    def next_index(self) -> int:
        """Index of the next prompt batch :meth:`take` hands to the trainer (the data position)."""
        return self._taken

    def take(self) -> TakenBatch[B]:
        """The next batch, in source order, at most ``max_staleness`` versions old; blocks until it is ready."""
        start = time.perf_counter()
        self._start_thread()
        with self._cond:
            index = self._taken
            while index not in self._ready:
                self._raise_if_failed()
                self._cond.wait()
            item = self._ready.pop(index)
            self._taken += 1
            self._cond.notify_all()  # a slot opened for the generator
        while self._version - item.version > self.max_staleness:
            self._dropped += 1
            with self.paused():
                item = _Ready(self._collect(index), self._version)
        return self._hand_over(item, index, start)

    def push_weights(self, version: int, sync: Callable[[], None] | None = None) -> None:
        """Load the trainer's weights into the engine as ``version`` (call when an RL step ends).

        Waits until the generator has claimed every batch it may sample under the old weights and the engine is
        idle, so that the version of each batch does not depend on timing.

        Args:
            version: the policy version the engine holds after the push (RL steps done).
            sync: the push of this call (one that logs at the caller's step); default the constructor's ``sync_fn``.
        """
        if version < self._version:
            raise ValueError(f"push_weights: version {version} is older than the engine's {self._version}")
        push = sync if sync is not None else self.sync_fn
        if push is None:
            raise ValueError("push_weights: no push given (sync) and none at construction (sync_fn)")
        if self._thread is None:  # nothing taken yet (the first push after a warm start or a restore)
            push()
            self._version = int(version)
            return
        with _EngineTurn(self, wait_for_claims=True):
            push()
            self._version = int(version)

    def paused(self) -> AbstractContextManager[None]:
        """Exclusive use of the engine for anything else (validation sampling, a sync check): the generator
        finishes its current batch and waits until the block ends."""
        return _EngineTurn(self, wait_for_claims=False)

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the generator thread after its current batch (idempotent); pending batches are discarded."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def state_dict(self, in_flight: bool = False) -> dict[str, Any]:
        """The data position (batches handed to the trainer) and running counters.

        Args:
            in_flight: also save the batches sampled ahead (``"ready"``: ``{index: (batch, version)}``), waiting
                for the one being generated. A resume then trains on exactly what the uninterrupted run trains on
                (same weights at the end). Without it, they are regenerated after :meth:`load_state_dict` from the
                restored weights: same prompts and seeds, but sampled at a newer version.
        """
        ready: dict[int, tuple[B, int]] = {}
        if in_flight:
            with self._cond:
                while self._busy:
                    self._raise_if_failed()
                    self._cond.wait()
                ready = {i: (item.batch, item.version) for i, item in sorted(self._ready.items()) if i >= self._taken}
        return {"ready": ready} | {
            "next_index": self._taken,
            "version": self._version,
            "dropped_stale": self._dropped,
            "staleness_sum": self._staleness_sum,
            "staleness_max": self._staleness_max,
            "max_staleness": self.max_staleness,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved data position; batches generated meanwhile are discarded."""
        self.close()
        with self._cond:
            self._taken = self._claimed = int(state["next_index"])
            self._version = int(state.get("version", self._version))
            self._dropped = int(state.get("dropped_stale", 0))
            self._staleness_sum = int(state.get("staleness_sum", 0))
            self._staleness_max = int(state.get("staleness_max", 0))
            self._ready.clear()
            for index, (batch, version) in sorted(state.get("ready", {}).items()):
                if int(index) == self._claimed:  # contiguous from the data position; later ones are regenerated
                    self._ready[int(index)] = _Ready(batch, int(version))
                    self._claimed += 1
            self._stop = False
            self._error = None

    # ------------------------------------------------------------------ internals
    def _collect(self, index: int) -> B:
        return self.collect_fn(self.batch_source(index), self.base_seed + index)

    def _hand_over(self, item: _Ready[B], index: int, start: float) -> TakenBatch[B]:
        staleness = self._version - item.version
        self._staleness_sum += staleness
        self._staleness_max = max(self._staleness_max, staleness)
        with self._cond:
            engine_wait, self._engine_wait = self._engine_wait, 0.0
        stats = {
            "rollout/staleness": float(staleness),
            "rollout/staleness_mean": self._staleness_sum / max(self._taken, 1),
            "rollout/staleness_max": float(self._staleness_max),
            "rollout/dropped_stale": float(self._dropped),
            "rollout/policy_version": float(item.version),
            "time/wait_trainer": time.perf_counter() - start,
            "time/wait_engine": engine_wait,
        }
        return TakenBatch(item.batch, index, item.version, staleness, stats)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._stop:
            raise RuntimeError("StalenessBoundedRollouts was closed; create a new one or load_state_dict")

    def _start_thread(self) -> None:
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._generate_loop, name="rollout-generator", daemon=True)
            self._thread.start()

    def _generate_loop(self) -> None:
        try:
            while True:
                idle_from = time.perf_counter()
                with self._cond:
                    while not self._stop and (self._busy or self._claimed >= self._taken + self.max_staleness):
                        self._cond.wait()
                    if self._stop:
                        return
                    index, version = self._claimed, self._version
                    self._claimed += 1
                    self._busy = True
                    self._engine_wait += time.perf_counter() - idle_from
                try:
                    batch = self._collect(index)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                with self._cond:
                    self._ready[index] = _Ready(batch, version)
                    self._cond.notify_all()
        except BaseException as err:  # handed to the trainer's thread, which re-raises it
            with self._cond:
                self._error = err
                self._cond.notify_all()


class _EngineTurn(AbstractContextManager[None]):
    """The trainer's exclusive use of the engine (weight push or a regeneration): the generator pauses."""

    def __init__(self, runner: StalenessBoundedRollouts[Any, Any], wait_for_claims: bool) -> None:
        self.runner = runner
        self.wait_for_claims = wait_for_claims

    def __enter__(self) -> None:
        r = self.runner
        with r._cond:
            while r._busy or (self.wait_for_claims and r._claimed < r._taken + r.max_staleness):
                r._raise_if_failed()
                r._cond.wait()
            r._raise_if_failed()
            r._busy = True

    def __exit__(self, *exc: object) -> None:
        r = self.runner
        with r._cond:
            r._busy = False
            r._cond.notify_all()


__all__ = ["StalenessBoundedRollouts", "TakenBatch", "check_engine_for_async"]
