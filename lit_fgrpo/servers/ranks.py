"""``RankedEngine``: the data-parallel ranks of a run share one fleet of servers, driven by rank 0 alone.

TRL's server mode: only the main process talks to the servers. Under DDP every rank holds the same weights, so one
fleet serves them all; a fleet per rank would start ``world * launch`` servers, and ranks pushing to the same ``urls``
would race each other's pushes. Rank 0 builds the real engine (:class:`~lit_fgrpo.servers.engine.ServerEngine`:
launches or connects, pushes, probes, restarts); the other ranks never start or reach a server.

Every call is one *round* on a gloo group of its own (created when the engine is built, on every rank): each rank's
request is gathered to rank 0 (``all_gather_object``), rank 0 serves them, each rank gets its own reply
(``scatter_object_list``). The group keeps these objects apart from DDP's gradient all-reduces on the default group,
also when the asynchronous generator thread calls :meth:`RankedEngine.generate`.

- ``generate``: rank 0 samples the concatenation of every rank's prompts with their own seeds and hands each rank its
  rows. Per-prompt seeds make a prompt's samples independent of the prompts beside it, so a rank gets exactly what it
  would have got by asking the servers itself.
- ``sync_weights`` and ``check_sync``: rank 0 pushes its policy (DDP's weights are equal on all ranks) and checks its
  own probe; every rank gets the metrics and the gap, or the same one-line error (a ``WeightSyncError`` or
  ``ServerError`` raised by rank 0 is raised on every rank, none waits forever).
- ``score``: every rank's rows, scored on rank 0.

Rounds are collectives: every rank must make the same calls in the same order. Training does (every rank samples
each step; dynamic sampling's skipping ranks take part with :meth:`join_round`); evaluation passes may hold fewer
batches on some ranks, so each rank ends a pass with :meth:`finish_rounds`, which keeps taking part in the others'
sampling rounds until every rank has ended. Ranks whose calls differ in kind get one error naming both calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lit_fgrpo.distributed.collectives import RankFailure, describe, is_distributed
from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.sync_check import WeightSyncError
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.servers.errors import ServerError

SAMPLING_KINDS = frozenset({"generate", "join", "done"})
"""Requests that may share a round: sampling, a rank with no prompts in it, a rank whose evaluation pass ended."""
SHARED_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e for e in (WeightSyncError, ServerError, ConfigError, ValueError)
}
"""Errors of rank 0 raised as themselves on the other ranks (anything else: :class:`RankFailure`)."""
Reply = tuple[str, Any]
"""``("ok", value)`` or ``("error", "TypeName: message")``."""


def shared_error(message: str, what: str) -> Exception:
    """Rank 0's ``TypeName: message`` as the exception to raise on another rank."""
    name, _, text = message.partition(": ")
    kind = SHARED_ERRORS.get(name)
    return kind(text) if kind is not None else RankFailure(f"rank 0 failed in {what}: {message}")


def own_seeds(prompts: int, sampling: SamplingConfig, seeds: Sequence[int] | None) -> list[int] | None:
    """A rank's per-prompt seeds as its own ``generate`` derives them (``sampling.seed + i * n``), made explicit before
    its prompts join the other ranks' (their positions in the concatenation would change the derived seeds)."""
    if seeds is not None:
        return [int(s) for s in seeds]
    return None if sampling.seed is None else [sampling.seed + i * sampling.n for i in range(prompts)]


def split_generation(generation: Generation, rows: list[int]) -> list[Generation]:
    """``generation``'s rows cut into consecutive parts of ``rows[r]`` rows (prompt-major, so a rank's prompts)."""
    parts, start = [], 0
    for count in rows:
        end = start + count
        logprobs = generation.sampling_logprobs
        parts.append(
            Generation(
                completion_ids=generation.completion_ids[start:end],
                sampling_logprobs=None if logprobs is None else logprobs[start:end],
                finished=generation.finished[start:end],
            )
        )
        start = end
    return parts


class RankedEngine(RolloutEngine):
    """One engine for every rank of the process group: ``inner`` lives on rank 0 (None elsewhere).

    Build it with :meth:`build` on every rank at the same time.
    """

    collective_rounds = True

    def __init__(self, inner: RolloutEngine | None, group: Any, rank: int, world: int) -> None:
        self.inner, self.group, self.rank, self.world = inner, group, rank, world
        self._push_metrics: dict[str, float] = {}
        self._local: dict[str, Any] = {}  # rank 0's own arguments of the round in progress (a model, tensors)
        self._error: Exception | None = None  # rank 0's own exception of the round in progress
        self._lock = threading.RLock()  # one round at a time in this process (the gather and its scatter)

    @classmethod
    def build(
        cls, factory: Callable[[], RolloutEngine], what: str = "building the vllm_server engine"
    ) -> RolloutEngine:
        """``factory()`` alone without a process group of several ranks; else on rank 0 only, shared by all ranks.

        Raises:
            Exception: rank 0's failure on every rank (its own exception there, the same one-line error elsewhere).
        """
        if not is_distributed():
            return factory()
        group = dist.new_group(backend="gloo")  # every rank, once per engine: objects apart from DDP's all-reduces
        rank, world = dist.get_rank(), dist.get_world_size()
        inner, error = None, None
        if rank == 0:
            try:
                inner = factory()
            except Exception as exc:  # noqa: BLE001 - every rank must learn of it
                error = exc
        outcome = [describe(error) if error is not None else None]
        dist.broadcast_object_list(outcome, src=0, group=group)
        if error is not None:
            raise error
        if outcome[0] is not None:
            raise shared_error(outcome[0], what)
        return cls(inner, group, rank, world)

    # ------------------------------------------------------------------ rounds
    def _round(self, kind: str, payload: Any, what: str, local: dict[str, Any] | None = None) -> Any:
        """Gather every rank's ``(kind, payload)``, let rank 0 serve them (with its ``local`` arguments, which do not
        travel: a model, tensors), return this rank's reply (or raise it)."""
        with self._lock:
            self._local = local or {}
            requests: list[Any] = [None] * self.world
            dist.all_gather_object(requests, (kind, payload), group=self.group)
            replies = self._serve(requests, what) if self.rank == 0 else None
            out: list[Any] = [None]
            dist.scatter_object_list(out, replies, src=0, group=self.group)
            status, value = out[0]
            error, self._error, self._local = self._error, None, {}
            if status == "ok":
                return value
            raise error if error is not None else shared_error(value, what)

    def _serve(self, requests: list[tuple[str, Any]], what: str) -> list[Reply]:
        """Rank 0: the replies to one round's requests, rank by rank (an exception becomes every rank's error)."""
        try:
            kinds = {kind for kind, _ in requests}
            if kinds <= SAMPLING_KINDS:
                return self._sample(requests)
            if len(kinds) > 1:
                calls = ", ".join(f"rank {r} {kind}" for r, (kind, _) in enumerate(requests))
                raise RuntimeError(f"ranks out of step on the shared vllm_server engine in {what}: {calls}")
            return self._serve_one(requests[0][0], [payload for _, payload in requests])
        except Exception as exc:  # noqa: BLE001 - handed to every rank
            self._error = exc
            return [("error", describe(exc))] * self.world

    def _sample(self, requests: list[tuple[str, Any]]) -> list[Reply]:
        """A sampling round: every ``generate`` request's prompts in one call, cut back into each rank's rows."""
        asked = [payload for kind, payload in requests if kind == "generate"]
        if not asked:  # only joining and finished ranks: "done" learns whether every rank has finished
            finished = all(kind == "done" for kind, _ in requests)
            return [("ok", finished if kind == "done" else None) for kind, _ in requests]
        samplings = [sampling for _, sampling, _ in asked]
        if any(s != samplings[0] for s in samplings):
            raise ValueError(f"ranks sample with different settings in one round: {samplings}")
        seeds = [seeds for _, _, seeds in asked]
        if any((s is None) != (seeds[0] is None) for s in seeds):
            raise ValueError("ranks mix seeded and unseeded sampling in one round")
        assert self.inner is not None
        prompts = [p for rank_prompts, _, _ in asked for p in rank_prompts]
        joined = None if seeds[0] is None else [s for rank_seeds in seeds for s in rank_seeds]
        parts = iter(
            split_generation(
                self.inner.generate(prompts, samplings[0], joined),
                [len(rank_prompts) * samplings[0].n for rank_prompts, _, _ in asked],
            )
        )
        return [
            ("ok", next(parts) if kind == "generate" else (False if kind == "done" else None)) for kind, _ in requests
        ]

    def _serve_one(self, kind: str, payloads: list[Any]) -> list[Reply]:
        """A round in which every rank made the same call (pushes and checks with rank 0's own arguments)."""
        inner, local = self.inner, self._local
        assert inner is not None
        if kind == "sync":
            inner.sync_weights(local["model"])
            return [("ok", inner.last_push_metrics())] * self.world
        if kind == "check":
            return [("ok", inner.check_sync(*local["check"]))] * self.world
        if kind == "score":
            rows = [len(prompts) for prompts, _, _ in payloads]
            prompts = [p for rank_prompts, _, _ in payloads for p in rank_prompts]
            completions = [c for _, rank_completions, _ in payloads for c in rank_completions]
            scored = [t.tolist() for t in inner.score(prompts, completions, payloads[0][2])]
            starts = [sum(rows[:r]) for r in range(self.world)]
            return [("ok", scored[s : s + n]) for s, n in zip(starts, rows)]
        raise ValueError(f"unknown round {kind!r}")

    # ------------------------------------------------------------------ the engine interface
    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """This rank's rows, sampled by rank 0's engine together with the other ranks' prompts (a collective)."""
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompt_ids)} prompts")
        payload = ([list(p) for p in prompt_ids], sampling, own_seeds(len(prompt_ids), sampling, seeds))
        result: Generation = self._round("generate", payload, "the rollout")
        return result

    def join_round(self, sampling: SamplingConfig) -> None:
        """Take part in a sampling round without prompts of this rank's own."""
        self._round("join", None, "the rollout")

    def finish_rounds(self) -> None:
        """This rank's evaluation pass is over: take part in the other ranks' remaining rounds until all are over."""
        while not self._round("done", None, "the evaluation"):
            pass

    def sync_weights(self, model: nn.Module) -> None:
        """Rank 0 pushes its policy (the ranks' weights are equal); every rank gets the push metrics (a collective)."""
        self._push_metrics = dict(self._round("sync", None, "the weight push", {"model": model}))

    def last_push_metrics(self) -> dict[str, float]:
        """The metrics of rank 0's last push, on every rank."""
        return dict(self._push_metrics)

    def check_sync(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        trainer_logprobs: list[torch.Tensor],
        tolerance: float,
        where: str,
    ) -> float:
        """Rank 0's check of every server on its own probe; the gap, or its ``WeightSyncError``, on every rank."""
        local = {"check": (prompt_ids, completion_ids, trainer_logprobs, tolerance, where)}
        gap: float = self._round("check", None, "the weight-sync check", local)
        return gap

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Every rank's rows scored by rank 0's engine; this rank's back (a collective)."""
        payload = ([list(p) for p in prompt_ids], [list(c) for c in completion_ids], temperature)
        rows: list[list[float]] = self._round("score", payload, "the weight-sync probe")
        return [torch.tensor(row) for row in rows]

    def sleep(self) -> None:
        if self.inner is not None:
            self.inner.sleep()

    def wake_up(self) -> None:
        if self.inner is not None:
            self.inner.wake_up()

    def close(self) -> None:
        """Rank 0 stops its servers (not a collective: ranks reach their teardown at different times)."""
        if self.inner is not None:
            self.inner.close()
