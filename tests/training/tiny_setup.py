"""Tiny, offline building blocks for the training-loop tests (a 2-layer maze policy, synthetic rollouts)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import PromptDataModule, grouped_data_settings
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import grouped_settings

TINY_MODEL = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 160,
    "tie_word_embeddings": True,
    "initializer_range": 0.15,
}
# configs/maze_tiny.yaml's model, written out so that a config rewrite cannot move the golden fixture.
MAZE_TINY_MODEL: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 160,
    "tie_word_embeddings": True,
}


def tiny_module(**kwargs: Any) -> FGRPOModule:
    """The tiny maze policy; ``kwargs`` name FGRPOModule settings flat (``gamma=0.5``, grouped here) or as groups."""
    settings: dict[str, Any] = {"model_config": TINY_MODEL, "tokenizer": "builtin:maze", "lr": 1e-2}
    return FGRPOModule(**grouped_settings(settings | kwargs))


def maze_data(**kwargs: Any) -> PromptDataModule:
    """A small maze datamodule (64 training prompts, 4 per step, 4 held out); ``kwargs`` override, named flat
    (``num_train=32``, grouped here as the checkpoints of before the groups are) or as groups."""
    settings: dict[str, Any] = dict(
        source="maze",
        num_train=64,
        num_val=4,
        num_test=4,
        val_size=4,
        prompts_per_step=4,
        tokenizer_path="builtin:maze",
    )
    return PromptDataModule(**grouped_data_settings(settings | kwargs))


def word_count_rollouts(**kwargs: Any) -> RolloutCallback:
    """HF-engine rollouts of 4 samples x 8 tokens scored by :func:`word_count_reward`; ``kwargs`` override."""
    settings: dict[str, Any] = dict(
        sampling=SamplingConfig(n=4, max_tokens=8, stop_token_ids=[7]),
        val_samples=4,
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
        log_samples_every=0,
    )
    return RolloutCallback(engine="hf", **(settings | kwargs))


def quiet_trainer(max_steps: int, callbacks: list[L.Callback], **kwargs: Any) -> L.Trainer:
    """A CPU Trainer without logger, progress bar, model summary or validation; ``kwargs`` override or add.

    Checkpointing is on only when ``callbacks`` holds a ``ModelCheckpoint`` (with its own directory): Lightning's
    default one would write ``checkpoints/`` into the working directory of whoever runs the tests.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    settings: dict[str, Any] = dict(
        logger=False, limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )  # fmt: skip
    return L.Trainer(max_steps=max_steps, callbacks=callbacks, **(settings | kwargs))


def synthetic_rollout(P: int = 4, G: int = 4, Tp: int = 6, T: int = 5, vocab: int = 17, seed: int = 0) -> RolloutBatch:
    """Random prompts/completions with mixed groups (success counts 1..G-1) and ragged completion lengths."""
    gen = torch.Generator().manual_seed(seed)
    B = P * G
    input_ids = torch.randint(4, vocab, (B, Tp + T), generator=gen)  # (B, Tp + T)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    attention_mask = torch.cat([torch.ones(B, Tp, dtype=torch.long), completion_mask.long()], dim=1)
    correct = torch.zeros(P, G, dtype=torch.bool)
    for p in range(P):
        correct[p, : 1 + p % (G - 1)] = True  # 1 .. G-1 successes: every group active, different mu_hat
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        rewards=correct.float(),
        correct=correct,
        max_completion_length=T,
    )


class HandOver(L.Callback):
    """Attaches the same synthetic rollout to every training batch (the RolloutCallback's part of the seam)."""

    def __init__(self, rollout: RolloutBatch) -> None:
        self.rollout = rollout

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch)
        batch.rollout = self.rollout


def run_steps(module: FGRPOModule, rollout: RolloutBatch, steps: int = 1) -> L.Trainer:
    loader = torch.utils.data.DataLoader([[]] * steps, batch_size=None, collate_fn=lambda batch: batch)
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[HandOver(rollout)],
        accelerator="cpu",
    )
    trainer.fit(module, loader)
    return trainer


def word_count_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """A dense toy reward (completion length in words, mod 3, halved) so random policies get mixed groups."""
    return [(len(c.split()) % 3) / 2 for c in completions]


class MemoryLogger(Logger):
    """A Lightning logger that keeps every ``log_metrics`` call in memory as (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((int(step or 0), {k: float(v) for k, v in metrics.items()}))

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def series(self, key: str) -> list[float]:
        """Every logged value of ``key``, in logging order."""
        return [metrics[key] for _, metrics in self.rows if key in metrics]

    def points(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of every logged value of ``key``."""
        return [(step, metrics[key]) for step, metrics in self.rows if key in metrics]
