"""Groups 3 and 4: non-finite, hanging and crashing reward functions make rows unscorable, counted, never a stall."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from typing import Any

import pytest
import torch

from lit_fgrpo.objectives.advantages import group_advantages
from lit_fgrpo.rewards import run_reward, score_completions

PROMPTS = ["p"] * 4
COMPLETIONS = ["ok", "inf", "nan", "ok"]


def by_text(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    table = {"ok": 1.0, "inf": math.inf, "-inf": -math.inf, "nan": math.nan, "zero": 0.0}
    return [table[c] for c in completions]


@pytest.mark.parametrize("bad", ["inf", "-inf", "nan"])
def test_nonfinite_reward_is_unscorable_and_counted(bad: str, caplog: pytest.LogCaptureFixture) -> None:
    completions = ["ok", bad, "zero", "ok"]
    with caplog.at_level(logging.WARNING):
        result = score_completions(PROMPTS, completions, {}, [by_text])
    assert math.isnan(result.rewards[1]) and result.rewards[[0, 2, 3]].tolist() == [1.0, 0.0, 1.0]
    assert result.num_failed == {"by_text": 1} and result.num_nonfinite == {"by_text": 1}
    assert "reward 'by_text' returned NaN or inf for 1 of 4 completions: unscorable" in caplog.text


def test_inf_reward_never_reaches_the_advantages() -> None:
    """The bug of issue 10: an inf reward made every advantage NaN. Now its row gets 0 and the group stays finite."""
    result = score_completions(PROMPTS, ["ok", "inf", "zero", "zero"], {}, [by_text])
    adv = group_advantages(result.rewards.view(1, 4), gamma=0.5, success=result.correct.view(1, 4))  # (1, 4)
    assert torch.isfinite(adv).all() and adv[0, 1] == 0
    reference = group_advantages(torch.tensor([[1.0, 0.0, 0.0]]), gamma=0.5)  # the three scorable rows alone
    torch.testing.assert_close(adv[0, [0, 2, 3]], reference[0])


def test_nonfinite_verdict_is_unjudged() -> None:
    result = score_completions(PROMPTS, COMPLETIONS, {}, [by_text], correctness_fn=by_text)
    assert result.correct.tolist() == [True, False, False, True] and result.num_unjudged == 2


def hang_on_slow(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    if "slow" in completions:
        time.sleep(30)
    return [1.0] * len(completions)


def test_thread_timeout_makes_only_the_hanging_row_unscorable() -> None:
    start = time.perf_counter()
    result = score_completions(["p"] * 3, ["a", "slow", "b"], {}, [hang_on_slow], reward_timeout=0.3)
    assert time.perf_counter() - start < 20  # the hang is 30 s: well under it means the timeout cut it (load-proof)
    assert result.rewards[[0, 2]].tolist() == [1.0, 1.0] and math.isnan(result.rewards[1])
    assert result.num_failed == {"hang_on_slow": 1} and result.num_timed_out == {"hang_on_slow": 1}


def test_process_timeout_kills_the_worker() -> None:
    start = time.perf_counter()
    scores, failed = run_reward(hang_on_slow, ["p"] * 2, ["a", "slow"], {}, timeout=1.0, isolation="process")
    assert time.perf_counter() - start < 20  # a worker start, 1 s of timeout and a kill, against a 30 s hang
    assert scores == [1.0, None] and failed == 1


def crash_on_boom(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    if "boom" in completions:
        os._exit(11)  # a crash no try/except can catch, like a segfault in a C extension
    return [0.5] * len(completions)


def test_process_isolation_survives_a_crashing_reward() -> None:
    counts: dict[str, int] = {}
    scores, failed = run_reward(crash_on_boom, ["p"] * 3, ["a", "boom", "b"], {}, 5.0, "process", counts)
    assert scores == [0.5, None, 0.5] and failed == 1 and counts == {"nonfinite": 0, "timed_out": 1, "wrong_length": 0}


def alarm_based(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """Like math-verify: a signal.alarm timeout, which only works in the main thread of a process."""
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.alarm(5)
    signal.alarm(0)
    return [1.0] * len(completions)


def test_signal_based_reward_needs_a_process() -> None:
    assert run_reward(alarm_based, ["p"], ["a"], {}, 5.0, "thread") == ([None], 1)  # signal only in main thread
    assert run_reward(alarm_based, ["p"], ["a"], {}, 5.0, "process") == ([1.0], 0)


def test_process_worker_returns_nonfinite_as_unscorable() -> None:
    counts: dict[str, int] = {}
    scores, failed = run_reward(by_text, PROMPTS, COMPLETIONS, {}, 5.0, "process", counts)
    assert scores == [1.0, None, None, 1.0] and failed == 2 and counts["nonfinite"] == 2


@pytest.mark.parametrize(("timeout", "isolation", "message"), [(0.0, "thread", "> 0"), (1.0, "fork", "'thread' or")])
def test_bad_timeout_settings_are_refused(timeout: float, isolation: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from lit_fgrpo.rewards.guarded_call import call_with_timeout

        call_with_timeout(lambda: 1, timeout, isolation)


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["no_timeout", "timeout"])
def test_process_isolation_contains_a_crash_with_or_without_a_timeout(
    timeout: float | None, capsys: pytest.CaptureFixture[str]
) -> None:
    counts: dict[str, int] = {}
    scores, failed = run_reward(crash_on_boom, ["p"] * 3, ["a", "boom", "b"], {}, timeout, "process", counts)
    assert scores == [0.5, None, 0.5] and failed == 1 and counts["timed_out"] == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: reward 'crash_on_boom' failed on 1 of 3 completions, rows 1 (1 timed out or")
    assert "RewardCrash('worker process died with exit code 11')" in lines[0]


def kill_on_boom(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    if "boom" in completions:
        os.kill(os.getpid(), signal.SIGKILL)  # the function kills its own process
    return [0.5] * len(completions)


@pytest.mark.parametrize("fn", [crash_on_boom, kill_on_boom], ids=["os_exit", "sigkill"])
def test_process_isolation_without_timeout_names_function_and_prompt(
    fn: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25: no timeout, the worker dies: one visible line naming the function, the row and its prompt."""
    completions = ["a", "b", "c", "boom"]  # two prompts of G = 2: the crash is row 3, prompt 1
    result = score_completions(["p"] * 4, completions, {}, [fn], reward_isolation="process", group_size=2)
    assert math.isnan(result.rewards[3]) and result.rewards[:3].tolist() == [0.5, 0.5, 0.5]
    assert result.num_failed == {fn.__name__: 1} and result.num_timed_out == {fn.__name__: 1}
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"warning: reward {fn.__name__!r} failed on 1 of 4 completions, rows 3 of prompts 1 (")
    death = "killed by SIGKILL" if fn is kill_on_boom else "died with exit code 11"
    assert death in lines[0]


def exit_on_boom(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    if "boom" in completions:
        sys.exit(3)  # the function ends its process the Python way: under thread isolation it ended the run, exit 3
    return [0.5] * len(completions)


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["no_timeout", "timeout"])
def test_thread_isolation_contains_a_reward_calling_sys_exit(
    timeout: float | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: sys.exit in a reward under thread isolation ended the whole run without a word; now its row only."""
    result = score_completions(
        ["p"] * 4, ["a", "b", "c", "boom"], {}, [exit_on_boom], reward_timeout=timeout, group_size=2
    )
    assert math.isnan(result.rewards[3]) and result.rewards[:3].tolist() == [0.5, 0.5, 0.5]
    assert result.num_failed == {"exit_on_boom": 1} and result.num_timed_out == {"exit_on_boom": 1}
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: reward 'exit_on_boom' failed on 1 of 4 completions, rows 3 of prompts 1 (")
    assert "the function called sys.exit(3)" in lines[0]
