"""``EngineSync``: a run's generation engine, built once from the policy, its weights pushed and checked.

The rollout callback owns one. After a push the engine's log-probs and the trainer's are compared on a small probe
(a few rows of the last rollout, both at temperature 1); the largest gap is logged as ``rollout/sync_logprob_delta``
and a gap beyond ``sync_tolerance`` raises :class:`~lit_fgrpo.engines.trainer_logprobs.WeightSyncError` on every rank.

Staleness. A warm start or a restored checkpoint changes the policy after the engine is built, so the callback marks
the engine stale at every stage start and on checkpoint load; :meth:`EngineSync.ensure_synced` then pushes before the
next sampling. Evaluation also pushes when optimizer steps happened since the last push (``sync_every`` > 1), so that
pass@k always measures the current policy.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lit_fgrpo.distributed import fail_together
from lit_fgrpo.engines.base import RolloutEngine
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.select import EngineKind, build_engine
from lit_fgrpo.engines.sync_check import default_sync_tolerance
from lit_fgrpo.engines.trainer_logprobs import policy_logprobs
from lit_fgrpo.rollout.collect import RolloutCollector, pad_id_of

if TYPE_CHECKING:
    from lit_fgrpo.rollout.consumer import RolloutConsumer

LogFn = Callable[[dict[str, float], int], None]
"""``log(metrics, step)``: where push metrics go (the callback passes the trainer's logger)."""

Probe = tuple[list[list[int]], list[list[int]]]
"""(prompt ids, completion ids) of the rows the sync check scores on both sides."""


class EngineSync:
    """Build the engine on first use, push the policy's weights into it and check the push.

    Args:
        kind: the engine kind (see :func:`~lit_fgrpo.engines.select.build_engine`).
        engine_kwargs: extra keyword arguments for the vLLM engine.
        hf_chunk_size: most rows per HF generation call.
        sync_tolerance: largest allowed |logp_engine - logp_trainer| on the probe; None: by the policy's dtype
            (:func:`~lit_fgrpo.engines.sync_check.default_sync_tolerance`).
        probe_rows: rows of the last rollout used as the probe (0 disables the check).
    """

    def __init__(
        self,
        kind: EngineKind,
        engine_kwargs: dict[str, Any],
        hf_chunk_size: int,
        sync_tolerance: float | None,
        probe_rows: int,
    ) -> None:
        self.kind, self.engine_kwargs, self.hf_chunk_size = kind, engine_kwargs, hf_chunk_size
        self.sync_tolerance, self.probe_rows = sync_tolerance, probe_rows
        self.engine: RolloutEngine | None = None
        self.last_sync_step = -1
        """The global step of the last push (-1: none yet); checkpointed by the callback."""
        self.stale = False
        """True while the engine may hold other weights than the policy; the next :meth:`ensure_synced` pushes."""
        self.probe: Probe | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.consumer: RolloutConsumer | None = None
        self.collector: RolloutCollector | None = None
        """Whose last rollout gives the probe of a push (set by the source that builds both)."""
        self.log: LogFn = lambda metrics, step: None

    def bind(self, consumer: RolloutConsumer, log: LogFn | None = None) -> None:
        """Push ``consumer.policy`` in :meth:`sync` and :meth:`ensure_synced`; their metrics go to ``log``."""
        self.consumer = consumer
        if log is not None:
            self.log = log

    def build(self, policy: nn.Module, tokenizer: Any) -> RolloutEngine:
        """The engine, built on the first call (the policy must be configured by then)."""
        if self.engine is None:
            self._workdir = tempfile.TemporaryDirectory(prefix="lit_fgrpo_engine_")
            self.engine = build_engine(
                self.kind, policy, tokenizer, self._workdir.name, hf_chunk_size=self.hf_chunk_size, **self.engine_kwargs
            )
        return self.engine

    def close(self) -> None:
        """Shut the engine down and remove its working directory; a later :meth:`build` starts a new one."""
        if self.engine is not None:
            self.engine.close()
        self.engine = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def remember_probe(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], group_size: int) -> None:
        """Keep the first :attr:`probe_rows` rows of a rollout (row r belongs to prompt r // G) as the next probe."""
        rows = min(self.probe_rows, len(completion_ids))
        self.probe = ([prompt_ids[r // group_size] for r in range(rows)], completion_ids[:rows])

    def push(self, policy: nn.Module, tokenizer: Any, step: int) -> dict[str, float]:
        """Push ``policy``'s weights and check them on the probe; returns ``rollout/sync_*`` metrics to log.

        Raises:
            WeightSyncError: On every rank, when the check fails on any rank (with that rank's message).
        """
        engine = self.build(policy, tokenizer)
        last = self.collector.last if self.collector is not None else None
        if last is not None:  # the rows of the latest rollout (training or evaluation) are the probe
            self.remember_probe(last.prompt_ids, last.completion_ids, last.group_size)
        engine.wake_up()  # a sleeping engine (level 1) has its weights offloaded; reload into live buffers
        start = time.perf_counter()
        engine.sync_weights(policy)
        metrics = {"rollout/sync_seconds": time.perf_counter() - start, **engine.last_push_metrics()}
        self.last_sync_step, self.stale = step, False
        # A failed check on one rank stops every rank with its message (not a hang in the next all-reduce).
        with fail_together(f"the weight sync at step {step}"):
            if self.probe_rows > 0 and self.probe is not None:
                metrics["rollout/sync_logprob_delta"] = self.check(policy, tokenizer, step)
        return metrics

    def sync(self, step: int) -> None:
        """Push the bound consumer's policy and check it; the metrics are logged at ``step``."""
        assert self.consumer is not None, "EngineSync.bind has not run"
        self.log(self.push(self.consumer.policy, self.consumer.tokenizer, step), step)

    def ensure_synced(self, step: int, prompt_ids: list[list[int]], evaluation_in_fit: bool = False) -> None:
        """Push before sampling when the engine may be behind the policy (stale, or for an evaluation during fit,
        optimizer steps since the last push); ``prompt_ids`` give a probe when no rollout has yet."""
        if self.needs_push(step, evaluation_in_fit):
            self.probe_from_prompts(prompt_ids)
            self.sync(step)

    def needs_push(self, step: int, evaluation_in_fit: bool) -> bool:
        """Stale, or (for an evaluation during fit) behind the policy by optimizer steps since the last push."""
        return self.stale or (evaluation_in_fit and self.last_sync_step != step)

    def probe_from_prompts(self, prompt_ids: list[list[int]]) -> None:
        """Before any rollout: the prompts' own last tokens forced as completions. Any tokens do; the check
        compares two models on the same forced sequence."""
        if self.probe is None and self.probe_rows > 0 and prompt_ids:
            rows = [prompt_ids[r % len(prompt_ids)] for r in range(self.probe_rows)]
            self.probe = (rows, [p[-8:] for p in rows])

    @torch.no_grad()
    def check(self, policy: nn.Module, tokenizer: Any, step: int) -> float:
        """Engine vs trainer log-probs on the probe, both at temperature 1: the largest gap (checked)."""
        assert self.engine is not None and self.probe is not None
        self.engine.wake_up()
        if isinstance(self.engine, HFEngine) and self.engine.model is policy:
            # The HF engine samples with the trainer's policy itself: both sides would run the same forward on
            # the same weights, so the gap is 0 by construction and the probe is skipped.
            return 0.0
        prompts, completions = self.probe
        trainer_lp = policy_logprobs(policy, prompts, completions, pad_id_of(tokenizer), temperature=1.0)
        where = f"RolloutCallback weight sync at step {step} (sync_tolerance)"
        tolerance = self.sync_tolerance
        if tolerance is None:
            tolerance = default_sync_tolerance(next(policy.parameters()).dtype)
        return self.engine.check_sync(prompts, completions, trainer_lp, tolerance, where)
