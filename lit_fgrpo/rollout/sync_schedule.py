"""``SyncRollouts``: generate the step's rollout, then train on it (``max_staleness = 0``).

Prompt p of training step s samples with ``prompt_seed(seed, p.position, s, TRAIN_STREAM)``, so a resumed run
repeats exactly and the completions a prompt gets do not depend on the number of ranks. The weights are pushed
after every ``sync_every`` optimizer steps (counted since the last push: a training batch may take several steps,
so ``step`` can jump over the multiples of ``sync_every``).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from lit_fgrpo.distributed import fail_together
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.rollout_settings import TRAIN_STREAM
from lit_fgrpo.rollout.schedule import RolloutParts, StepContext


class SyncRollouts:
    """The synchronous schedule; :class:`~lit_fgrpo.rollout.dynamic_schedule.DynamicRollouts` changes only :meth:`sample`."""

    def start(self, parts: RolloutParts, data: Any) -> None:
        """Nothing to check: any data module whose batches are prompt records will do."""

    def sample(self, parts: RolloutParts, batch: PromptBatch, call: StepContext) -> RolloutBatch:
        """The scored groups of the loader's prompts, seeded by the step."""
        # Every rank runs the same training batches: a rollout that raises on one rank stops them all.
        with fail_together(f"the rollout at step {call.step}"):
            return parts.collector.collect(batch.records, parts.train_sampling, step=call.step, stream=TRAIN_STREAM)

    def take(self, parts: RolloutParts, batch: PromptBatch, call: StepContext) -> RolloutBatch:
        timer, sync = call.timer, parts.engine_sync
        with timer.phase("sync"):
            if sync.stale:  # a warm start or a restore changed the policy after the last push
                call.log(sync.push(call.step, parts.collector.last, batch.prompt_ids), call.step)
        start = time.perf_counter()
        rollout = self.sample(parts, batch, call)
        # The collector times generation itself; the rest of collecting (decoding, rewards, packing) is "reward".
        generate = rollout.stats.get("generation_seconds", 0.0)
        timer.add("generate", generate)
        timer.add("reward", time.perf_counter() - start - generate)
        sampled = sum(len(ids) for ids in rollout.completion_ids)
        if rollout.conversations:  # a multi-turn row's completion also holds its environment's tokens
            sampled = int(rollout.stats["generated_tokens"])
        timer.add_tokens("generate", sampled)
        parts.collector.engine.sleep()  # the optimizer step needs the memory; the next push or generation wakes the engine
        return rollout

    def after_step(self, parts: RolloutParts, call: StepContext) -> None:
        sync = parts.engine_sync
        if call.step - sync.last_sync_step >= parts.settings.sync_every:
            with call.timer.phase("sync"):  # logged on this step by the module's on_train_batch_end
                call.log(sync.push(call.step, parts.collector.last), call.step)

    def paused(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


__all__ = ["SyncRollouts"]
