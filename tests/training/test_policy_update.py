"""PolicyUpdate without a Trainer: a plain torch optimizer gives the weights of FGRPOModule under a Trainer."""

from __future__ import annotations

import torch

from lit_fgrpo.training.update_handles import TorchCollectives, TorchOptimizerStep
from tests.training.tiny_setup import run_steps, synthetic_rollout, tiny_module

SETTINGS = dict(num_iterations=2, mini_batch_prompts=2, micro_batch_rows=5, beta=0.05, seed=0)


def test_plain_torch_update_matches_the_trainer_bit_for_bit() -> None:
    rollout = synthetic_rollout()
    under_trainer = tiny_module(**SETTINGS)
    run_steps(under_trainer, rollout, steps=1)

    plain = tiny_module(**SETTINGS)
    config = plain.configure_optimizers()  # the same AdamW and warm-up schedule, outside Lightning
    optimizer = TorchOptimizerStep(config["optimizer"], config["lr_scheduler"]["scheduler"])
    result = plain.policy_update().step(rollout, optimizer, TorchCollectives())

    assert optimizer.steps_taken == 4  # mu = 2 passes x 2 mini-batches
    assert result.num_prompts == 4 and "train/loss" in result.metrics and "rollout/reward_mean" in result.metrics
    trained, expected = plain.policy.state_dict(), under_trainer.policy.state_dict()
    assert set(trained) == set(expected)
    for name, value in expected.items():
        assert torch.equal(trained[name], value), name
