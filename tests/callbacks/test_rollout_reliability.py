"""RolloutCallback's reliability settings: reward timeouts forwarded to scoring, the group size in checkpoints."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import pytest

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.data import PromptRecord
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.errors import ConfigError
from tests.training.tiny_setup import tiny_module


def slow_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    time.sleep(0.3)
    return [1.0 for _ in completions]


def test_reward_timeout_reaches_the_scoring_and_is_counted() -> None:
    callback = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=2, max_tokens=3),
        val_samples=1,
        reward_funcs=["tests.callbacks.test_rollout_reliability:slow_reward"],
        reward_timeout=0.05,
    )
    callback.setup(L.Trainer(accelerator="cpu", logger=False), tiny_module(), "fit")
    record = PromptRecord(prompt="<bos> WALL PATH", prompt_ids=[1, 9, 8], columns={}, index=0)
    rollout = callback.source.collect([record], callback.settings.train_sampling(), 0, 0)
    assert rollout.stats["reward_timeouts"] == 2.0  # both completions of the one group
    assert rollout.stats["reward_nonfinite"] == 0.0
    assert rollout.rewards.isnan().all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"reward_timeout": 0.0}, "RolloutCallback.reward_timeout"),
     ({"reward_timeout": float("inf")}, "RolloutCallback.reward_timeout"),
     ({"reward_isolation": "fork"}, "RolloutCallback.reward_isolation")],
)  # fmt: skip
def test_bad_reward_guard_settings_name_the_flag(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RolloutCallback(**kwargs)


def test_resuming_with_another_group_size_says_which_wins(caplog: pytest.LogCaptureFixture) -> None:
    saved = RolloutCallback(sampling=SamplingConfig(n=4)).state_dict()
    assert saved["group_size"] == 4
    resumed = RolloutCallback(sampling=SamplingConfig(n=8))
    with caplog.at_level(logging.WARNING, logger="lit_fgrpo.callbacks.rollout"):
        resumed.load_state_dict(saved)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "resuming with RolloutCallback.sampling.n=8 (group size G) but the checkpoint was trained with 4: "
        "the config's value 8 wins from here on"
    ]
    caplog.clear()
    RolloutCallback(sampling=SamplingConfig(n=4)).load_state_dict(saved)
    assert not caplog.records
