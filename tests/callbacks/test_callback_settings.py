"""RolloutCallback / WarmStartCallback reject bad settings at start-up, naming the flag."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_fgrpo.callbacks import RolloutCallback, WarmStartCallback
from lit_fgrpo.engines.base import SamplingConfig
from tests.training.tiny_setup import tiny_module


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sampling": SamplingConfig(n=1)}, r"sampling.n \(the group size G\) must be >= 2"),
        ({"val_samples": 0}, "val_samples"),
        ({"sync_every": 0}, "sync_every"),
        ({"engine": "sglang"}, "engine"),
        ({"reward_funcs": ["maze"], "reward_weights": [1.0, 2.0]}, "reward_weights"),
        ({"reward_funcs": ["no_such_reward"]}, "no_such_reward"),
    ],
)
def test_rollout_callback_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, ImportError), match=match):
        RolloutCallback(**kwargs)


def test_sampling_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingConfig(max_tokens=0)


def test_fewer_validation_samples_than_k_is_rejected_at_setup() -> None:
    module = tiny_module(val_pass_at_k=[1, 64])
    callback = RolloutCallback(val_samples=16, validate_at_start=False)
    trainer = L.Trainer(max_steps=1, callbacks=[callback], logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"val_samples=16 is fewer than the largest pass@k k=64"):
        trainer.fit(module, torch.utils.data.DataLoader([0], batch_size=1))


def test_warm_start_rejects_negative_steps() -> None:
    with pytest.raises(ValueError, match="WarmStartCallback.steps"):
        WarmStartCallback(steps=-1)
