"""``SampleTable``: a table of sample completions logged to MLflow every few training steps.

A multi-turn episode's row also holds its whole ``conversation``, one message per line with its role in brackets
(``[assistant] 21``, ``[user] Wrong, try again.``, ``[tool] 84``), its number of model ``turns`` and its ``fault``
(why it is unscorable, ``""`` when it is not).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger
from typing_extensions import override

from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch

log = logging.getLogger(__name__)


def sample_rows(rollout: RolloutBatch, step: int, rows: int) -> dict[str, list[Any]]:
    """The first ``rows`` completions of a rollout as table columns (step, prompt, completion, reward, correct; for
    multi-turn episodes also conversation and turns)."""
    rows = min(rows, len(rollout.completions))
    table: dict[str, list[Any]] = {
        "step": [step] * rows,
        "prompt": rollout.prompts[:rows],
        "completion": rollout.completions[:rows],
        "reward": [float(x) for x in rollout.rewards.reshape(-1)[:rows]],
        "correct": [bool(x) for x in rollout.correct.reshape(-1)[:rows]],
    }
    if rollout.conversations:
        conversations = rollout.conversations[:rows]
        table["conversation"] = [conversation_text(messages) for messages in conversations]
        table["turns"] = [sum(m.get("role") == "assistant" for m in messages) for messages in conversations]
        if rollout.faults:
            table["fault"] = rollout.faults[:rows]  # "" for a healthy episode, else why it is unscorable
    return table


def conversation_text(messages: list[dict[str, str]]) -> str:
    """A conversation as text: each message on its own line(s), after its role in brackets."""
    return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in messages)


class SampleTable(L.Callback):
    """Log ``samples/step_XXXXXX.json`` (MLflow ``log_table``) from the training rollout every ``every`` steps.

    Args:
        every: log every this many optimizer steps (0 = never); needs an ``MLFlowLogger``, else does nothing.
        rows: completions per table.
    """

    def __init__(self, every: int = 50, rows: int = 8) -> None:
        if every < 0 or rows < 1:
            raise ValueError(f"SampleTable needs every >= 0 and rows >= 1, got every={every}, rows={rows}")
        self._every = every
        self._rows = rows

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The step before the update, as the rollout was sampled (the rollout callback attached it just before).
        self._step = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        logger = trainer.logger
        step = self._step
        if not self._every or step % self._every or not isinstance(logger, MLFlowLogger) or logger.run_id is None:
            return
        if not isinstance(batch, PromptBatch) or batch.rollout is None:
            return
        table = sample_rows(batch.rollout, step, self._rows)
        try:
            logger.experiment.log_table(logger.run_id, data=table, artifact_file=f"samples/step_{step:06d}.json")
        except Exception as err:  # a logging hiccup must never stop training
            log.warning("could not log the sample table: %s", err)
