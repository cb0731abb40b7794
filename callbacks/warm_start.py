"""``WarmStartCallback``: a supervised warm start on the training set's target answers before RL.

The paper trains its maze policy from scratch, so RL has no signal until the policy solves some mazes: it first
fits the target paths (paper §6). The callback does exactly that at the start of ``fit`` on the data module's
training records (``answer`` column), logs ``warm_start/loss`` and skips itself on a resumed run.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import lightning as L
from typing_extensions import override

from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.rollout.consumer import PolicyHolder, check_consumer
from lit_fgrpo.training.sft import supervised_warm_start


class WarmStartCallback(L.Callback):
    """Supervised steps on (prompt, answer) pairs before the first RL step.

    Args:
        steps: optimizer steps (0 = off). Budgeted by steps, not seconds.
        batch_size: examples per step.
        lr: AdamW learning rate.
        schedule: constant or cosine decay.
        answer_field: the record column holding the target completion text.
        append_eos: append the tokenizer's EOS id when the encoded answer does not end with it.
        max_examples: use at most this many training records (None = all).
    """

    def __init__(
        self,
        steps: int = 400,
        batch_size: int = 64,
        lr: float = 1e-3,
        schedule: Literal["constant", "cosine"] = "constant",
        answer_field: str = "answer",
        append_eos: bool = True,
        max_examples: int | None = None,
    ) -> None:
        if steps < 0:
            raise ValueError(f"WarmStartCallback.steps must be >= 0, got {steps}")
        if batch_size < 1:
            raise ValueError(f"WarmStartCallback.batch_size must be >= 1, got {batch_size}")
        if not (math.isfinite(lr) and lr > 0):  # torch would only say "Invalid learning rate" once training starts
            raise ValueError(f"WarmStartCallback.lr must be finite and > 0, got {lr}")
        self.steps, self.batch_size, self.lr, self.schedule = steps, batch_size, lr, schedule
        self.answer_field, self.append_eos, self.max_examples = answer_field, append_eos, max_examples
        self.done = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.done or self.steps == 0 or trainer.ckpt_path is not None:
            return
        check_consumer(pl_module, PolicyHolder, "WarmStartCallback")
        holder = cast(PolicyHolder, pl_module)
        # Lightning sets `trainer.datamodule` at fit time without declaring it on the class.
        datamodule = getattr(trainer, "datamodule", None)
        records = datamodule.splits.get("train") if isinstance(datamodule, PromptDataModule) else None
        if not records:
            raise ValueError("WarmStartCallback needs a PromptDataModule with a training split (datamodule.splits)")
        tokenizer = holder.tokenizer
        examples = []
        for record in records[: self.max_examples]:
            if self.answer_field not in record.columns:
                raise ValueError(f"WarmStartCallback.answer_field={self.answer_field!r} is not a column of the data")
            target = tokenizer(str(record.columns[self.answer_field]), add_special_tokens=False)["input_ids"]
            if self.append_eos and (not target or target[-1] != tokenizer.eos_token_id):
                target = [*target, tokenizer.eos_token_id]
            examples.append((record.prompt_ids, target))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def on_log(step: int, loss: float) -> None:
            if trainer.logger is not None:
                trainer.logger.log_metrics({"warm_start/loss": loss}, step=step - self.steps)

        supervised_warm_start(
            holder.policy,
            examples,
            self.steps,
            pad,
            batch_size=self.batch_size,
            lr=self.lr,
            schedule=self.schedule,
            on_log=on_log,
        )
        self.done = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = bool(state_dict.get("done", False))
