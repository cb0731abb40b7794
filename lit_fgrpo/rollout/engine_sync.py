"""``EngineSync``: a run's generation engine, built once from the policy, its weights pushed and checked.

The rollout source owns one. After a push the engine's log-probs and the trainer's are compared on a small probe
(a few rows of the last rollout, which the caller passes in, both at temperature 1); the largest gap is returned as
``rollout/sync_logprob_delta`` and a gap beyond ``sync_tolerance`` raises
:class:`~lit_fgrpo.engines.sync_check.WeightSyncError` on every rank. An engine without weights of its own (the HF
engine samples with the policy itself) has nothing to receive or check: its push only records the step.

Staleness. A warm start or a restored checkpoint changes the policy after the engine is built, so the callback marks
the engine stale at every stage start and on checkpoint load; the next sampling then pushes first (a schedule reads
:attr:`EngineSync.stale`, evaluation asks :meth:`EngineSync.ensure_synced`). Evaluation also pushes when optimizer
steps happened since the last push (``sync_every`` > 1), so that pass@k always measures the current policy.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from torch import nn

from lit_fgrpo.distributed import fail_together
from lit_fgrpo.engines.base import RolloutEngine
from lit_fgrpo.engines.prepared_weights import DecodeDtype
from lit_fgrpo.engines.trainer_logprobs import check_policy_sync
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.collect import pad_id_of
from lit_fgrpo.rollout.engine_select import EngineKind, build_engine

Probe = tuple[list[list[int]], list[list[int]]]
"""(prompt ids, completion ids) of the rows the sync check scores on both sides."""


class EngineSync:
    """Build the engine on first use, push the policy's weights into it and check the push.

    Args:
        kind: the engine kind (see :func:`~lit_fgrpo.rollout.engine_select.build_engine`).
        engine_kwargs: extra keyword arguments for the vLLM engine.
        hf_chunk_size: most rows per HF generation call.
        sync_tolerance: largest allowed |logp_engine - logp_trainer| on the probe; None: by the policy's dtype
            (:func:`~lit_fgrpo.engines.sync_check.default_sync_tolerance`).
        probe_rows: rows of the last rollout used as the probe (0 disables the check).
        decode_dtype: the HF engines' decoding matmuls (:class:`~lit_fgrpo.engines.hf.HFEngine`).
        pack_weights: the HF engines multiply frozen weights by packed copies.
    """

    def __init__(
        self,
        kind: EngineKind,
        engine_kwargs: dict[str, Any],
        hf_chunk_size: int,
        sync_tolerance: float | None,
        probe_rows: int,
        decode_dtype: DecodeDtype = "float32",
        pack_weights: bool = True,
    ) -> None:
        self.kind, self.engine_kwargs, self.hf_chunk_size = kind, engine_kwargs, hf_chunk_size
        self.sync_tolerance, self.probe_rows = sync_tolerance, probe_rows
        self.decode_dtype: DecodeDtype = decode_dtype
        self.pack_weights = pack_weights
        self.engine: RolloutEngine | None = None
        self.last_sync_step = -1
        """The global step of the last push (-1: none yet); checkpointed by the callback."""
        self.stale = False
        """True while the engine may hold other weights than the policy; the next :meth:`ensure_synced` pushes."""
        self.probe: Probe | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.policy: nn.Module | None = None
        """The policy the engine was built from: what each push pushes and checks against."""
        self.tokenizer: Any = None

    def build(self, policy: nn.Module, tokenizer: Any) -> RolloutEngine:
        """The engine, built on the first call from ``policy`` (configured by then), whose weights it then receives."""
        if self.engine is None:
            self._workdir = tempfile.TemporaryDirectory(prefix="lit_fgrpo_engine_")
            self.engine = build_engine(
                self.kind, policy, tokenizer, self._workdir.name, hf_chunk_size=self.hf_chunk_size,
                decode_dtype=self.decode_dtype, pack_weights=self.pack_weights, **self.engine_kwargs,
            )  # fmt: skip
            self.policy, self.tokenizer = policy, tokenizer
        return self.engine

    def close(self) -> None:
        """Shut the engine down and remove its working directory; a later :meth:`build` starts a new one."""
        if self.engine is not None:
            self.engine.close()
        self.engine, self.policy, self.tokenizer = None, None, None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def remember_probe(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        group_size: int,
        row_prompt_ids: list[list[int]] | None = None,
    ) -> None:
        """Keep the first :attr:`probe_rows` rows of a rollout as the next probe: row r's prompt is
        ``row_prompt_ids[r]`` when given (a multi-turn episode's, with its model and environment tokens after it), else
        prompt ``r // G``'s."""
        rows = min(self.probe_rows, len(completion_ids))
        prompts = row_prompt_ids[:rows] if row_prompt_ids else [prompt_ids[r // group_size] for r in range(rows)]
        self.probe = (prompts, completion_ids[:rows])

    def push(
        self, step: int, last: RolloutBatch | None = None, prompt_ids: list[list[int]] | None = None
    ) -> dict[str, float]:
        """Push the policy's weights and check them on the probe; returns ``rollout/sync_*`` metrics to log at ``step``.

        Args:
            step: the optimizer step of the push (recorded as :attr:`last_sync_step`; names the push in errors).
            last: the latest rollout (training or evaluation): its first rows are the probe.
            prompt_ids: before any rollout, prompts whose own last tokens make the probe (when there is none yet).

        Raises:
            WeightSyncError: On every rank, when the check fails on any rank (with that rank's message).
        """
        assert self.engine is not None and self.policy is not None, "EngineSync.build has not run"
        engine, policy = self.engine, self.policy
        if last is not None:
            self.remember_probe(last.prompt_ids, last.completion_ids, last.group_size, last.row_prompt_ids)
        elif prompt_ids:
            self.probe_from_prompts(prompt_ids)
        probed = self.probe_rows > 0 and self.probe is not None
        metrics: dict[str, float] = {"rollout/sync_seconds": 0.0}
        if engine.has_own_weights:
            engine.wake_up()  # a sleeping engine (level 1) has its weights offloaded; reload into live buffers
            start = time.perf_counter()
            engine.sync_weights(policy)
            metrics = {"rollout/sync_seconds": time.perf_counter() - start, **engine.last_push_metrics()}
        self.last_sync_step, self.stale = step, False
        # A failed check on one rank stops every rank with its message (not a hang in the next all-reduce). Every rank
        # enters it, also one whose engine needs no push, since ranks may differ in that (a failing rank's own copy).
        with fail_together(f"the weight sync at step {step}"):
            if probed and engine.has_own_weights:
                metrics["rollout/sync_logprob_delta"] = self.check(policy, self.tokenizer, step)
            elif probed:
                # The engine samples with the trainer's policy itself: nothing moved, and both sides of the check
                # would run the same forward on the same weights, so the gap is 0 by construction.
                metrics["rollout/sync_logprob_delta"] = 0.0
        return metrics

    def ensure_synced(
        self,
        step: int,
        last: RolloutBatch | None,
        prompt_ids: list[list[int]],
        evaluation_in_fit: bool = False,
    ) -> dict[str, float] | None:
        """Push before sampling when the engine may be behind the policy (stale, or for an evaluation during fit,
        optimizer steps since the last push); the push's metrics, None without one. ``last`` and ``prompt_ids``
        give the probe (see :meth:`push`)."""
        if self.needs_push(step, evaluation_in_fit):
            return self.push(step, last, prompt_ids)
        return None

    def needs_push(self, step: int, evaluation_in_fit: bool) -> bool:
        """Stale, or (for an evaluation during fit) behind the policy by optimizer steps since the last push."""
        return self.stale or (evaluation_in_fit and self.last_sync_step != step)

    def probe_from_prompts(self, prompt_ids: list[list[int]]) -> None:
        """Before any rollout: the prompts' own last tokens forced as completions. Any tokens do; the check
        compares two models on the same forced sequence. Empty prompts (``--data.source environment``: ``reset()``
        gives the prompt) have no tokens to force: without another, the first rollout makes the probe."""
        prompt_ids = [prompt for prompt in prompt_ids if prompt]
        if self.probe is None and self.probe_rows > 0 and prompt_ids:
            rows = [prompt_ids[r % len(prompt_ids)] for r in range(self.probe_rows)]
            self.probe = (rows, [p[-8:] for p in rows])

    @torch.no_grad()
    def check(self, policy: nn.Module, tokenizer: Any, step: int) -> float:
        """Engine vs trainer log-probs on the probe, both at temperature 1: the largest gap (checked)."""
        assert self.engine is not None and self.probe is not None
        self.engine.wake_up()
        prompts, completions = self.probe
        where = f"RolloutCallback weight sync at step {step} (sync_tolerance)"
        pad = pad_id_of(tokenizer)
        return check_policy_sync(self.engine, policy, prompts, completions, self.sync_tolerance, where, pad)
