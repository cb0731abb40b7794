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
from lit_fgrpo.rollout.parts import RolloutParts, StepContext
from lit_fgrpo.rollout.rollout_settings import TRAIN_STREAM


class SyncRollouts:
    """The synchronous schedule; :class:`~lit_fgrpo.rollout.dynamic_schedule.DynamicRollouts` changes only :meth:`sample`."""

    def start(self, parts: RolloutParts, data: Any) -> None:
        """Nothing to check: any data module whose batches are prompt records will do."""

    def sample(self, parts: RolloutParts, batch: PromptBatch, ctx: StepContext) -> RolloutBatch:
        """The scored groups of the loader's prompts, seeded by the step."""
        # Every rank runs the same training batches: a rollout that raises on one rank stops them all.
        with fail_together(f"the rollout at step {ctx.step}"):
            return parts.collector.collect(batch.records, parts.train_sampling, step=ctx.step, stream=TRAIN_STREAM)

    def take(self, parts: RolloutParts, batch: PromptBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        timer = parts.timer
        with timer.phase("sync"):
            parts.engine_sync.ensure_synced(ctx.step, batch.prompt_ids)
        start = time.perf_counter()
        rollout = self.sample(parts, batch, ctx)
        # The collector times generation itself; the rest of collecting (decoding, rewards, packing) is "reward".
        generate = rollout.stats.get("generation_seconds", 0.0)
        timer.add("generate", generate)
        timer.add("reward", time.perf_counter() - start - generate)
        timer.add_tokens("generate", sum(len(ids) for ids in rollout.completion_ids))
        parts.collector.engine.sleep()  # the optimizer step needs the memory; the next push or generation wakes the engine
        return rollout, {}

    def after_step(self, parts: RolloutParts, step: int) -> None:
        if step - parts.engine_sync.last_sync_step >= parts.settings.sync_every:
            with parts.timer.phase("sync"):  # logged on this step by the module's on_train_batch_end
                parts.engine_sync.sync(step)

    def paused(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


__all__ = ["SyncRollouts"]
