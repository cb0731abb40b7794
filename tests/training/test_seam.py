"""One training batch followed through the public seam: records -> PromptBatch -> rollout -> training_step.

No private attribute is touched: the module's ``on_after_batch_transfer`` wraps the records, the
RolloutCallback attaches ``batch.rollout``, ``training_step`` trains on it, and a watcher callback sees the
same object at every station.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from typing_extensions import override

from lit_fgrpo.callbacks import RolloutCallback, RolloutConsumer
from lit_fgrpo.data import PromptRecord
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.rollout import PromptBatch, RolloutBatch, RolloutCollector, SamplingConfig, pad_id_of
from tests.training.tiny_setup import tiny_module, word_count_reward


def records() -> list[PromptRecord]:
    return [PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={}, index=i) for i in range(2)]


class Watcher(L.Callback):
    """Runs after the RolloutCallback: records what the batch carries at start and end of the step."""

    def __init__(self) -> None:
        self.started: list[tuple[int, RolloutBatch]] = []
        self.ended: list[RolloutBatch | None] = []

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch) and batch.rollout is not None
        self.started.append((id(batch), batch.rollout))

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch) and id(batch) == self.started[-1][0]
        self.ended.append(batch.rollout)


def test_one_batch_through_the_public_seam() -> None:
    module = tiny_module(gamma=0.5)
    assert isinstance(module, RolloutConsumer)
    before = [p.detach().clone() for p in module.policy.parameters()]
    loader = torch.utils.data.DataLoader([records()], batch_size=None, collate_fn=lambda batch: batch)
    watcher = Watcher()
    rollouts = RolloutCallback(
        sampling=SamplingConfig(n=4, max_tokens=6),
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
    )
    trainer = L.Trainer(
        max_steps=1, callbacks=[rollouts, watcher], logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(module, loader)
    (_, rollout), (ended,) = watcher.started[0], watcher.ended
    assert ended is rollout and rollout.rewards.shape == (2, 4)  # the step trained on the attached rollout
    assert trainer.callback_metrics["rollout/reward_mean"] == pytest.approx(float(torch.nanmean(rollout.rewards)))
    if bool((module.advantages(rollout) != 0).any()):
        assert any(not torch.equal(b, p) for b, p in zip(before, module.policy.parameters()))


def test_the_same_seam_without_a_trainer() -> None:
    """A user's own loop: wrap, collect, backward; gradients appear on the policy."""
    module = tiny_module(gamma=0.5)
    batch = module.on_after_batch_transfer(records(), 0)
    assert isinstance(batch, PromptBatch) and batch.rollout is None
    with pytest.raises(RuntimeError, match="RolloutCallback"):
        batch.take_rollout()
    engine = HFEngine(module.policy, pad_id_of(module.tokenizer), module.tokenizer.eos_token_id)
    collector = RolloutCollector(engine, module.tokenizer, [word_count_reward])
    for seed in range(20):  # a seed whose groups have mixed rewards
        batch.rollout = collector.collect(batch.records, SamplingConfig(n=4, max_tokens=6), seed=seed)
        if bool((module.advantages(batch.rollout) != 0).any()):
            break
    pieces = module.backward_on(batch.take_rollout())
    assert pieces and any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.policy.parameters())


def test_a_module_without_policy_is_refused_at_setup() -> None:
    class NotAConsumer(L.LightningModule):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            return None

        def configure_optimizers(self) -> Any:
            return None

    trainer = L.Trainer(max_steps=1, callbacks=[RolloutCallback()], logger=False, enable_checkpointing=False)
    with pytest.raises(TypeError, match="RolloutConsumer"):
        trainer.fit(NotAConsumer(), torch.utils.data.DataLoader([0]))


def test_policy_is_built_in_configure_model_in_the_trainer_precision() -> None:
    module = tiny_module()
    trainer = L.Trainer(precision="bf16-true", max_steps=0, logger=False, enable_checkpointing=False)
    module.trainer = trainer  # attached as Lightning does before configure_model
    module.configure_model()
    dtypes = {p.dtype for p in module.policy.parameters()}
    assert dtypes == {torch.bfloat16}
    first = module.policy
    module.configure_model()  # idempotent
    assert module.policy is first
    # seeded: a second build (another rank) gives the same weights
    other = tiny_module()
    for (name, p), (_, q) in zip(tiny_module().policy.named_parameters(), other.policy.named_parameters()):
        assert torch.equal(p, q), name
