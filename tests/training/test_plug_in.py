"""The plug-in recipes of README.md and docs/guide.md, run for real: (a) FGRPOModule with a user's own datamodule and Trainer,
(b) group_advantages + policy_loss inside a user's own training_step, (c) a user's own LightningModule behind
RolloutCallback."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from typing_extensions import override

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import PromptRecord
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.objectives import GroupWeight, group_advantages, policy_loss
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout import PromptBatch, RolloutBatch, as_prompt_batch
from tests.training.tiny_setup import TINY_MODEL, synthetic_rollout, tiny_module


class MyPrompts(L.LightningDataModule):
    """A user's own data module: any iterable of lists of PromptRecord works."""

    def train_dataloader(self) -> Any:
        records = [PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={}, index=i) for i in range(2)]
        return torch.utils.data.DataLoader([records] * 3, batch_size=None, collate_fn=lambda batch: batch)


def test_recipe_a_module_with_own_datamodule_and_trainer() -> None:
    from lit_fgrpo import FGRPOModule
    from lit_fgrpo.training.module_settings import ObjectiveSettings, OptimizerSettings, PolicySettings

    module = FGRPOModule(
        policy=PolicySettings(model_config=TINY_MODEL, tokenizer="builtin:maze"),
        objective=ObjectiveSettings(gamma=0.5),
        optimizer=OptimizerSettings(lr=1e-2),
    )
    rollouts = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, max_tokens=6),
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
    )
    before = [p.detach().clone() for p in module.policy.parameters()]
    trainer = L.Trainer(max_steps=2, callbacks=[rollouts], logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=MyPrompts())
    assert trainer.global_step == 2
    assert any(not torch.equal(b, p) for b, p in zip(before, module.policy.parameters()))


def test_recipe_b_objectives_in_own_training_step() -> None:
    policy = tiny_module().policy
    batch = synthetic_rollout()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]

    # --- the user's own training_step, as in the README ---
    adv = group_advantages(batch.rewards, gamma=0.5, success=batch.correct).view(-1)  # (B,)
    T = batch.completion_mask.shape[1]
    logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, -T - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, -T:, None]).squeeze(-1)  # (B, T)
    loss, stats = policy_loss(logp, None, adv, batch.completion_mask, loss_type="dapo")
    loss.backward()
    optimizer.step()
    # -------------------------------------------------------

    assert torch.isfinite(loss) and "clip_frac" in stats
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.parameters()))


class MyModule(L.LightningModule):
    """Recipe (c): a user's own module behind RolloutCallback (the RolloutConsumer protocol)."""

    # what RolloutCallback reads besides policy and tokenizer (lit_fgrpo.callbacks.RolloutConsumer)
    temperature = 1.0
    pass_at_k_ks = [1]
    importance_correction = "none"
    group_weight = GroupWeight("focal", gamma=0.5)

    def __init__(self) -> None:
        super().__init__()
        donor = tiny_module()
        self.policy, self.tokenizer = donor.policy, donor.tokenizer
        self.timer = PhaseTimer()  # the callback times generate/reward/sync into it
        self.seen: list[RolloutBatch] = []

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> PromptBatch:
        return as_prompt_batch(batch)

    @override
    def training_step(self, batch: PromptBatch, batch_idx: int) -> torch.Tensor:
        rollout = batch.take_rollout()
        self.seen.append(rollout)
        adv = group_advantages(rollout.rewards, gamma=0.5, success=rollout.correct).view(-1)  # (B,)
        T = rollout.completion_mask.shape[1]
        logits = self.policy(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits[:, -T - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, rollout.input_ids[:, -T:, None]).squeeze(-1)  # (B, T)
        loss, _ = policy_loss(logp, None, adv, rollout.completion_mask, loss_type="dapo")
        return loss

    @override
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.policy.parameters(), lr=1e-2)


def test_recipe_c_own_module_behind_the_rollout_callback() -> None:
    module = MyModule()
    rollouts = RolloutCallback(
        sampling=SamplingConfig(n=4, max_tokens=6),
        reward_funcs=["tests.training.tiny_setup:word_count_reward"],
        validate_at_start=False,
    )
    trainer = L.Trainer(max_steps=2, callbacks=[rollouts], logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=MyPrompts())
    assert len(module.seen) == 2 and module.seen[0].rewards.shape == (2, 4)
    assert module.timer.total(("generate",)) > 0  # the callback timed its generation into the module's timer


def test_a_module_missing_consumer_members_is_refused_in_one_line() -> None:
    class PolicyOnly(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            donor = tiny_module()
            self.policy, self.tokenizer = donor.policy, donor.tokenizer

    with pytest.raises(TypeError) as caught:
        RolloutCallback(validate_at_start=False).setup(L.Trainer(logger=False), PolicyOnly(), "fit")
    message = str(caught.value)
    assert "\n" not in message and "RolloutConsumer" in message
    for name in ("group_weight", "importance_correction", "pass_at_k_ks", "temperature", "timer"):
        assert name in message
