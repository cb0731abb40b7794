"""``RolloutSource`` on its own, per mode: no Trainer, the HF engines and the tiny policy.

References: the synchronous take equals the collector called directly with the same seeds; dynamic sampling keeps
only informative groups and consumes the draw cursor; asynchronous rollouts hand over every batch once, at
staleness min(i, k), and resume from their state. Every call brings its step, timer and logging function: a push
is logged at the step of the call that made it, and the call's timer receives the schedule's phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.data import PromptRecord
from lit_fgrpo.objectives import GroupWeight
from lit_fgrpo.reporting.timing import PhaseTimer
from lit_fgrpo.rollout import PromptBatch, SamplingConfig
from lit_fgrpo.rollout.group_filter import DynamicSampling
from lit_fgrpo.rollout.rollout_settings import TRAIN_STREAM, RolloutSettings
from lit_fgrpo.rollout.schedule import LogFn, StepContext
from lit_fgrpo.rollout.source import RolloutSource
from tests.training.tiny_setup import tiny_module

REWARD = "tests.training.tiny_setup:word_count_reward"


@dataclass
class Consumer:
    """The RolloutConsumer protocol as a plain object (no LightningModule)."""

    policy: nn.Module
    tokenizer: Any
    temperature: float = 1.0
    pass_at_k_ks: list[int] = field(default_factory=lambda: [1])
    group_weight: GroupWeight = field(default_factory=lambda: GroupWeight("focal", gamma=0.5))
    importance_correction: str = "token"
    timer: PhaseTimer = field(default_factory=PhaseTimer)


def consumer() -> Consumer:
    module = tiny_module()
    return Consumer(module.policy, module.tokenizer)


def record(position: int) -> PromptRecord:
    ids = [1, 9 + position % 5, 8, 8 + position % 3]
    return PromptRecord(prompt="<bos> WALL PATH", prompt_ids=ids, columns={}, index=position, position=position)


class Stream:
    """A data module's two access paths: batches by index (async) and a draw cursor (dynamic sampling)."""

    def __init__(self, per_batch: int = 4) -> None:
        self.per_batch, self.drawn, self.train_position = per_batch, 0, 0

    def train_batch(self, index: int) -> list[PromptRecord]:
        return [record(index * self.per_batch + i) for i in range(self.per_batch)]

    def draw_prompts(self, count: int) -> list[PromptRecord]:
        out = [record(1000 + self.drawn + i) for i in range(count)]
        self.drawn += count
        return out


class Logged:
    """A :data:`LogFn` that keeps every (step, metrics) it is given."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))

    def steps(self, key: str) -> list[int]:
        return [step for step, metrics in self.rows if key in metrics]


def call(step: int, data: Any = None, log: LogFn | None = None, timer: PhaseTimer | None = None) -> StepContext:
    return StepContext(
        step, 1, data, timer if timer is not None else PhaseTimer(), log if log is not None else Logged()
    )


def source(**settings: Any) -> tuple[RolloutSource, Consumer]:
    base: dict[str, Any] = {"sampling": SamplingConfig(n=4, max_tokens=6), "reward_funcs": [REWARD]}
    made = RolloutSource(RolloutSettings(**(base | settings)))
    user = consumer()
    made.bind(user)
    return made, user


def test_synchronous_take_is_the_collector_with_the_step_seeds_and_pushes_every_sync_every() -> None:
    made, _ = source(engine="hf_copy", sync_every=2)
    made.start(None)
    batch = PromptBatch([record(p) for p in range(3)])
    rollout = made.take(batch, StepContext(step=5, world_size=1, data=None))
    assert made.last_sync_step == 5  # stale at start: pushed first
    reference = made.build().collector.collect(
        batch.records, made.settings.train_sampling(), step=5, stream=TRAIN_STREAM
    )
    assert rollout.completion_ids == reference.completion_ids
    torch.testing.assert_close(rollout.rewards, reference.rewards, rtol=0, atol=0, equal_nan=True)
    made.after_step(call(6))  # one optimizer step since the push at 5: sync_every=2 waits
    assert made.last_sync_step == 5
    made.after_step(call(7))
    assert made.last_sync_step == 7
    state = made.state_dict()
    made.close()
    again, _ = source(engine="hf_copy", sync_every=2)
    again.load_state_dict(state)
    assert again.last_sync_step == 7 and again.engine_sync.stale  # pushes before its first rollout


def test_a_push_probes_the_first_rows_of_the_last_rollout() -> None:
    made, _ = source(engine="hf_copy", sync_probe_rows=3)
    made.start(None)
    first = made.take(PromptBatch([record(p) for p in range(2)]), call(0))
    rollout = made.take(PromptBatch([record(p) for p in range(2, 4)]), call(1))
    made.after_step(
        call(2)
    )  # sync_every=1: pushed, probed on rows 0..2 of this step's rollout (row r is prompt r // G)
    G = rollout.group_size
    assert made.engine_sync.probe == ([rollout.prompt_ids[r // G] for r in range(3)], rollout.completion_ids[:3])
    assert first.completion_ids[:3] != rollout.completion_ids[:3]
    made.close()


def test_dynamic_sampling_keeps_informative_groups_drawn_from_the_cursor() -> None:
    made, _ = source(dynamic_sampling=DynamicSampling(max_rounds=3, oversample=2.0))
    data = Stream()
    made.start(data)
    rollout = made.take(PromptBatch([record(p) for p in range(4)]), call(0, data))
    assert data.drawn >= 4  # the loader's batch only paces the step: its prompts are not the ones trained on
    spread = rollout.rewards.view(rollout.num_prompts, rollout.group_size)  # (P, G)
    assert rollout.num_prompts <= 4
    assert bool(((spread.max(dim=1).values - spread.min(dim=1).values) > 0).all())  # every kept group is mixed


def test_dynamic_sampling_refuses_a_data_module_without_a_cursor() -> None:
    made, _ = source(dynamic_sampling=DynamicSampling())
    with pytest.raises(ValueError, match="draw_prompts"):
        made.start(object())


def test_environment_owned_data_without_an_environment_is_refused_before_the_engine() -> None:
    from lit_fgrpo.data import ENVIRONMENT_SOURCE, PromptDataModule
    from lit_fgrpo.errors import ConfigError

    made = RolloutSource(RolloutSettings())
    with pytest.raises(ConfigError, match="^--data.source environment needs --rollout.environment: "):
        made.start(PromptDataModule(source=ENVIRONMENT_SOURCE))
    assert made.engine_sync.engine is None  # refused before the engine was built


def test_asynchronous_rollouts_hand_over_each_batch_once_at_bounded_staleness() -> None:
    made, _ = source(engine="hf_copy", max_staleness=1)
    data = Stream()
    made.start(data)
    staleness, positions = [], []
    for step in range(4):
        data.train_position = step + 1  # the data module counts a batch when it reaches the training step
        batch = PromptBatch(data.train_batch(step))
        timer = PhaseTimer()
        rollout = made.take(batch, call(step, data, timer=timer))
        # the batch's own statistics ride on it (the module logs them as rollout/*), the waits go to the timer
        assert rollout.num_prompts == 4 and rollout.stats["staleness_max"] == min(step, 1)
        assert {"wait", "wait_trainer", "wait_engine"} <= set(timer.seconds)
        assert made.asynchronous is not None and made.asynchronous.last is not None
        staleness.append(made.asynchronous.last.staleness)
        positions.append([r.position for r in batch.records])
        made.after_step(call(step + 1))
    made.close()
    assert staleness == [0, 1, 1, 1]
    assert positions == [[4 * i + j for j in range(4)] for i in range(4)]


def test_a_consumer_whose_settings_do_not_fit_is_refused() -> None:
    settings = RolloutSettings(engine="hf_copy", max_staleness=1, reward_funcs=[REWARD], val_samples=4)
    with pytest.raises(ValueError, match="importance_correction"):
        settings.check_consumer(Consumer(nn.Linear(1, 1), None, importance_correction="none"))
    with pytest.raises(ValueError, match="val_samples=4 is fewer than the largest pass@k k=8"):
        settings.check_consumer(Consumer(nn.Linear(1, 1), None, pass_at_k_ks=[1, 8]))


@pytest.mark.parametrize("settings", [{"engine": "hf_copy"}, {"engine": "hf_copy", "max_staleness": 1}])
def test_each_push_is_logged_at_the_step_of_the_call_that_made_it(settings: dict[str, Any]) -> None:
    """Synchronous and asynchronous (the generator thread's push): the step comes with the call, nothing else."""
    made, _ = source(**settings)
    data = Stream()
    made.start(data)
    log = Logged()
    for step, done in [(0, 3), (1, 7), (2, 9)]:  # a batch may take several optimizer steps: 3, 7, 9 after each
        data.train_position = step + 1
        made.take(PromptBatch(data.train_batch(step)), call(3 * step, data, log=log))  # the start's push: at 0
        made.after_step(call(done, data, log=log))
    made.close()
    assert log.steps("rollout/sync_seconds") == [0, 3, 7, 9]
    assert log.steps("rollout/sync_logprob_delta") == [0, 3, 7, 9]  # each checked (hf_copy holds its own weights)
    assert made.last_sync_step == 9


def test_the_hf_engine_push_moves_nothing_and_reports_a_zero_gap() -> None:
    made, _ = source(engine="hf")
    made.start(None)
    assert made.engine is not None and not made.engine.has_own_weights
    log = Logged()
    made.take(PromptBatch([record(p) for p in range(2)]), call(4, log=log))
    assert [(step, metrics["rollout/sync_logprob_delta"]) for step, metrics in log.rows] == [(4, 0.0)]
    made.close()


def test_an_evaluation_push_is_logged_at_its_call_and_the_timer_is_the_calls() -> None:
    made, _ = source(engine="hf_copy", sync_every=3)
    made.start(None)
    timer, log = PhaseTimer(), Logged()
    made.take(PromptBatch([record(p) for p in range(2)]), call(0, log=log, timer=timer))
    assert {"sync", "generate", "reward"} <= set(timer.seconds) and timer.tokens_per_s("generate") > 0
    made.after_step(call(1, log=log))  # sync_every=3: no push yet
    assert log.steps("rollout/sync_seconds") == [0]
    # an evaluation during fit after unpushed optimizer steps pushes first, at its own step
    made.evaluation(PromptBatch([record(p) for p in range(2)]), call(1, log=log), stream=1, in_fit=True)
    assert log.steps("rollout/sync_seconds") == [0, 1]
    made.close()
