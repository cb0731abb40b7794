"""The non-finite guard in FGRPOModule's optimizer loop, and inf/NaN rewards, through the public seam.

A NaN gradient (a hook on one parameter) or a NaN loss (NaN engine log-probs under importance correction) skips
the optimizer step: the weights stay finite and equal to the last good ones, the skip is logged as
``train/nonfinite_skips``, and ``max_nonfinite_skips`` skips in a row stop the run naming the step and the quantity.
A reward function that returns inf/NaN makes those rows unscorable: counted, logged, advantage 0.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
from typing_extensions import override

from lit_fgrpo.data import PromptRecord
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.errors import ConfigError, NonFiniteError
from lit_fgrpo.rollout import RolloutCollector, SamplingConfig, pad_id_of
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.training.module import FGRPOModule
from tests.training.tiny_setup import synthetic_rollout, tiny_module


class Snapshots(L.Callback):
    """Weights after every training batch, and the logged skip count."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.skips: list[float] = []

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.weights.append({k: v.detach().clone() for k, v in pl_module.policy.named_parameters()})
        self.skips.append(float(trainer.callback_metrics["train/nonfinite_skips"]))


class Poison(L.Callback):
    """Attaches ``rollouts[batch_idx]`` (the rollout callback's part of the seam) and poisons chosen steps.

    ``grad_steps``: a hook turns the gradient of the first parameter into NaN during those steps.
    """

    def __init__(self, rollouts: list[RolloutBatch], grad_steps: set[int]) -> None:
        self.rollouts, self.grad_steps = rollouts, grad_steps
        self.active = False
        self.hooked = False

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch)
        batch.rollout = self.rollouts[batch_idx]
        if not self.hooked:
            first = next(p for p in pl_module.policy.parameters() if p.requires_grad)
            first.register_hook(lambda grad: grad * math.nan if self.active else grad)
            self.hooked = True
        self.active = batch_idx in self.grad_steps


def fit(module: FGRPOModule, rollouts: list[RolloutBatch], grad_steps: set[int], skipped: int = 0) -> Snapshots:
    """One batch per rollout; ``skipped`` of them take no optimizer step (max_steps counts optimizer steps)."""
    snapshots = Snapshots()
    loader = torch.utils.data.DataLoader([[]] * len(rollouts), batch_size=None, collate_fn=lambda batch: batch)
    trainer = L.Trainer(
        max_steps=len(rollouts) - skipped,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Poison(rollouts, grad_steps), snapshots],
        accelerator="cpu",
    )
    trainer.fit(module, loader)
    return snapshots


def nan_logprob_rollout() -> RolloutBatch:
    """Engine log-probs with a NaN: under importance correction the loss is NaN."""
    rollout = synthetic_rollout(seed=1)
    rollout.sampling_logp = torch.full(rollout.completion_mask.shape, -1.0)  # (B, T)
    rollout.sampling_logp[0, 0] = math.nan
    return rollout


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for name, value in a.items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, b[name]), name


def test_nan_gradient_skips_the_step_and_keeps_the_last_good_weights() -> None:
    module = tiny_module(max_grad_norm=1.0)
    snaps = fit(module, [synthetic_rollout(seed=s) for s in range(4)], grad_steps={1}, skipped=1)
    assert_same(snaps.weights[1], snaps.weights[0])  # step 1 skipped: the weights of step 0
    assert not torch.equal(snaps.weights[2]["model.norm.weight"], snaps.weights[1]["model.norm.weight"])
    assert snaps.skips == [0.0, 1.0, 1.0, 1.0]
    assert module.nonfinite_guard.num_skipped == 1 and module.nonfinite_guard.consecutive == 0
    assert module.trainer.global_step == 3  # the skipped step is no optimizer step


def test_nan_loss_from_engine_logprobs_is_skipped() -> None:
    module = tiny_module(importance_correction="token")
    rollouts = [synthetic_rollout(seed=0), nan_logprob_rollout(), synthetic_rollout(seed=2)]
    for rollout in (rollouts[0], rollouts[2]):
        rollout.sampling_logp = torch.full(rollout.completion_mask.shape, -1.0)  # (B, T)
    snaps = fit(module, rollouts, grad_steps=set(), skipped=1)
    assert_same(snaps.weights[1], snaps.weights[0])
    assert snaps.skips == [0.0, 1.0, 1.0]


def test_consecutive_nan_steps_stop_naming_the_step_and_the_parameter() -> None:
    module = tiny_module(max_nonfinite_skips=2)
    with pytest.raises(NonFiniteError, match=r"^step 1: grad of model\.embed_tokens\.weight is not finite for the 2th"):
        fit(module, [synthetic_rollout(seed=s) for s in range(4)], grad_steps={1, 2})


def test_guard_state_travels_in_the_checkpoint() -> None:
    module = tiny_module()
    module.nonfinite_guard.load_state_dict({"num_skipped": 3, "consecutive": 1})
    checkpoint: dict[str, Any] = {}
    module.on_save_checkpoint(checkpoint)
    restored = tiny_module()
    restored.on_load_checkpoint(checkpoint)
    assert restored.nonfinite_guard.state_dict() == {"num_skipped": 3, "consecutive": 1}


def test_max_nonfinite_skips_is_checked() -> None:
    with pytest.raises(ConfigError, match="--model.optimizer.max_nonfinite_skips"):
        tiny_module(max_nonfinite_skips=0)


def inf_for_short(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """inf for completions of < 2 words, NaN for 2 words, else the word count mod 2."""
    out: list[float | None] = []
    for c in completions:
        words = len(c.split())
        out.append(math.inf if words < 2 else math.nan if words == 2 else float(words % 2))
    return out


def test_nonfinite_rewards_are_unscorable_counted_and_get_advantage_zero() -> None:
    module = tiny_module()
    engine = HFEngine(module.policy, pad_id_of(module.tokenizer), module.tokenizer.eos_token_id)
    collector = RolloutCollector(engine, module.tokenizer, [inf_for_short])
    records = [
        PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={}, index=0),
        PromptRecord(prompt="<bos> PATH", prompt_ids=[1, 8], columns={}, index=1),
    ]
    rollout = collector.collect(records, SamplingConfig(n=8, max_tokens=4), seed=3)
    words = torch.tensor([len(c.split()) for c in rollout.completions]).view(2, 8)  # (P, G)
    expected_bad = int((words <= 2).sum())
    assert expected_bad > 0, "the seed must produce some short completions"
    assert rollout.stats["reward_nonfinite"] == expected_bad
    assert torch.isnan(rollout.rewards[words <= 2]).all()
    advantages = module.advantages(rollout)  # (P, G)
    assert torch.isfinite(advantages).all()
    assert (advantages[words <= 2] == 0).all()
