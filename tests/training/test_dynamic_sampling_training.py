"""Dynamic sampling wired into RolloutCallback: P informative groups per trained batch, the cap, exact resume.

A real Trainer, the tiny maze policy, the HF engine and PromptDataModule. The reward makes the groups of about half
of the prompts constant (by a hash of the prompt text), so dynamic sampling has something to drop.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.batch import PromptBatch
from lit_fgrpo.rollout.group_filter import DynamicSampling
from tests.training.tiny_setup import tiny_module

P = 4


def half_constant_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """0 for every completion of an 'even' prompt (a constant group); else a bit of the completion's hash."""
    return [
        0.0 if zlib.crc32(p.encode()) % 2 == 0 else float(zlib.crc32(c.encode()) % 2)
        for p, c in zip(prompts, completions, strict=True)
    ]


class Drawn(PromptDataModule):
    """PromptDataModule that remembers the global positions of every prompt drawn, per training step."""

    draws: list[tuple[int, list[int]]] = []

    @override
    def draw_prompts(self, count: int) -> list[Any]:
        records = super().draw_prompts(count)
        step = self.trainer.global_step if self.trainer is not None else -1
        Drawn.draws.append((step, [int(r.position) for r in records]))
        return records


class Inspect(L.Callback):
    """After the rollout callback: the trained batch's size, informative groups and dynamic-sampling stats."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch) and batch.rollout is not None
        informative = (pl_module.advantages(batch.rollout) != 0).any(dim=1)  # (P,)
        self.seen.append(
            {"groups": batch.rollout.num_prompts, "informative": int(informative.sum())} | batch.rollout.stats
        )


def fit(
    dynamic: DynamicSampling, max_steps: int, tmp: Path | None = None, ckpt_path: str | None = None
) -> tuple[Inspect, L.Trainer]:
    data = Drawn(
        source="maze", splits={"num_train": 64, "num_val": 0, "num_test": 0}, loader={"prompts_per_step": P},
        tokenizer_path="builtin:maze",
    )  # fmt: skip
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, max_tokens=6),
        val_samples=4,
        reward_funcs=["tests.training.test_dynamic_sampling_training:half_constant_reward"],
        validate_at_start=False,
        dynamic_sampling=dynamic,
        seed=5,
    )
    inspect = Inspect()
    callbacks: list[L.Callback] = [rollout, inspect]
    if tmp is not None:
        callbacks.append(ModelCheckpoint(dirpath=tmp, save_last=True, every_n_train_steps=1, save_top_k=0))
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=tmp is not None,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(tiny_module(lr=1e-2), data, ckpt_path=ckpt_path)
    return inspect, trainer


def test_every_trained_batch_has_p_informative_groups() -> None:
    Drawn.draws = []
    inspect, trainer = fit(DynamicSampling(max_rounds=8, oversample=2.0), max_steps=3)
    assert [s["groups"] for s in inspect.seen] == [P] * 3
    assert [s["informative"] for s in inspect.seen] == [P] * 3
    assert all(1 <= s["dynamic_rounds"] <= 8 and s["dynamic_groups_padded"] == 0 for s in inspect.seen)
    # prompts are consumed in order, none replayed: positions 0, 1, 2, ... across rounds and steps
    positions = [p for _, drawn in Drawn.draws for p in drawn]
    assert positions == list(range(len(positions)))
    assert sum(s["dynamic_prompts_drawn"] for s in inspect.seen) == len(positions) > 3 * P
    assert trainer.callback_metrics["rollout/dynamic_groups_kept"] == P


def test_the_round_cap_is_respected_and_short_batches_are_padded() -> None:
    Drawn.draws = []
    inspect, _ = fit(DynamicSampling(max_rounds=1, oversample=1.0), max_steps=2)
    assert [s["dynamic_rounds"] for s in inspect.seen] == [1.0, 1.0]
    assert [len(drawn) for _, drawn in Drawn.draws] == [P, P]
    assert [s["groups"] for s in inspect.seen] == [P, P]
    padded = [s["dynamic_groups_padded"] for s in inspect.seen]
    assert any(padded), "half of the groups are constant: one round of P prompts must come up short"
    assert [s["informative"] for s in inspect.seen] == [P - n for n in padded]


@pytest.mark.slow  # three short fits, ~30 s on the shared 2-core CPU
def test_resume_continues_at_the_next_undrawn_prompt(tmp_path: Path) -> None:
    config = DynamicSampling(max_rounds=4, oversample=1.5)
    Drawn.draws = []
    fit(config, max_steps=3)
    straight = [drawn for step, drawn in Drawn.draws if step == 2]
    Drawn.draws = []
    fit(config, max_steps=2, tmp=tmp_path)
    before = [p for _, drawn in Drawn.draws for p in drawn]
    Drawn.draws = []
    fit(config, max_steps=3, tmp=tmp_path, ckpt_path=str(tmp_path / "last.ckpt"))
    resumed = [drawn for step, drawn in Drawn.draws if step == 2]
    assert resumed == straight
    assert min(p for drawn in resumed for p in drawn) == max(before) + 1  # the discarded prompts are not replayed


def test_dynamic_sampling_needs_a_data_module_that_draws() -> None:
    callback = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=2, max_tokens=2), dynamic_sampling=DynamicSampling()
    )
    trainer = L.Trainer(max_steps=1, callbacks=[callback], logger=False, enable_checkpointing=False, accelerator="cpu")
    loader = torch.utils.data.DataLoader([[]], batch_size=None, collate_fn=lambda batch: batch)
    with pytest.raises(ConfigError, match="^RolloutCallback.dynamic_sampling needs a data module with draw_prompts"):
        trainer.fit(tiny_module(), loader)
