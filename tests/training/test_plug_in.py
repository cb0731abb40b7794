"""The README's two plug-in recipes, run for real: (a) FGRPOModule with a user's own datamodule and Trainer,
(b) group_advantages + policy_loss inside a user's own training_step."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import PromptRecord
from lit_fgrpo.objectives import group_advantages, policy_loss
from lit_fgrpo.rollout.base import SamplingConfig
from tests.training.tiny_setup import TINY_MODEL, synthetic_rollout, tiny_module


class MyPrompts(L.LightningDataModule):
    """A user's own data module: any iterable of lists of PromptRecord works."""

    def train_dataloader(self) -> Any:
        records = [PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={}, index=i) for i in range(2)]
        return torch.utils.data.DataLoader([records] * 3, batch_size=None, collate_fn=lambda batch: batch)


def test_recipe_a_module_with_own_datamodule_and_trainer() -> None:
    from lit_fgrpo import FGRPOModule

    module = FGRPOModule(model_config=TINY_MODEL, tokenizer="builtin:maze", gamma=0.5, lr=1e-2)
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
