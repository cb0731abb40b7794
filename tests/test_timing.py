"""PhaseTimer: exact accumulation (injected clock), phases adding up to the wall time, throughput, overhead."""

from __future__ import annotations

import time

import pytest

from lit_fgrpo.timing import STEP_PHASES, PhaseTimer, phase_overhead_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_accumulates_per_phase_and_resets() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    for seconds in (1.0, 2.5):
        with timer.phase("generate"):
            clock.now += seconds
    with timer.phase("backward"):
        clock.now += 0.25
    timer.add("wait", 0.5)
    assert timer.calls == {"generate": 2, "backward": 1, "wait": 1}
    assert timer.summary(reset=False) == {"time/generate": 3.5, "time/backward": 0.25, "time/wait": 0.5}
    assert timer.total() == 4.25 and timer.total(["generate", "wait"]) == 4.0
    timer.summary()
    assert timer.summary() == {}


def test_a_raising_block_is_still_timed() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(RuntimeError), timer.phase("reward"):
        clock.now += 2.0
        raise RuntimeError("reward function failed")
    assert timer.seconds == {"reward": 2.0}


def test_tokens_per_second_over_the_named_phases() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    for name, seconds in (("generate", 2.0), ("forward", 1.0), ("backward", 3.0)):
        with timer.phase(name):
            clock.now += seconds
    timer.add_tokens("generate", 600)
    timer.add_tokens("train", 400, phases=("forward", "backward"))
    timer.add_tokens("train", 200, phases=("forward", "backward"))
    values = timer.summary()
    assert values["time/generate_tokens_per_s"] == 300.0
    assert values["time/train_tokens_per_s"] == 150.0  # 600 tokens over forward + backward = 4 s
    assert PhaseTimer().tokens_per_s("generate") == 0.0  # nothing timed: no division by zero


def test_phases_add_up_to_the_wall_time() -> None:
    """A step made only of timed phases: their sum is the measured wall time within 10%."""
    timer = PhaseTimer()
    start = time.perf_counter()
    for _ in range(3):
        for name in STEP_PHASES:
            with timer.phase(name):
                time.sleep(0.002)
    wall = time.perf_counter() - start
    values = timer.summary()
    assert set(values) == {f"time/{name}" for name in STEP_PHASES}
    assert abs(sum(values.values()) - wall) <= 0.1 * wall
    assert all(v >= 3 * 0.002 for v in values.values())


def test_overhead_per_phase_call_is_small() -> None:
    # A loose bound (the figure is a few µs; CI machines are shared): the timers can stay always on.
    assert phase_overhead_s(calls=2_000) < 1e-4
