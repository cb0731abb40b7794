"""TRL's environment contract, point by point, on classes written the way TRL documents them
(:mod:`tests.environments.trl_shaped`), with a scripted policy (no model): each test states the TRL rule it checks.

References: the tool messages and rewards each call must produce, computed by hand; TRL's rules from the
``environment_factory`` docstring and ``_generate_and_score_completions`` in trl 1.16.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from lit_fgrpo.environments import (
    ChatTurns,
    EpisodeDriver,
    EpisodeLimits,
    EpisodeStart,
    RemoteEnvironment,
    TextEnvironment,
    episode_stats,
    load_environments,
)
from lit_fgrpo.errors import ConfigError
from tests.environments import trl_shaped
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer, prompt_ids


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def replies(*texts: str) -> ScriptedModel:
    return ScriptedModel(lambda question, turn: texts[min(turn, len(texts) - 1)])


def driver(environment: Any, isolation: str = "process", timeout: float | None = 30.0, **kwargs: Any) -> EpisodeDriver:
    environments = load_environments(environment, None, kwargs.pop("tools", ()))
    names = list(environments.specs) or [""]
    turns = {name: ChatTurns(chat_tokenizer(), tools=environments.tool_schemas(name)) for name in names}
    limits = EpisodeLimits(max_turns=kwargs.pop("max_turns", 3), max_episode_tokens=kwargs.pop("tokens", 600))
    return EpisodeDriver(environments, turns, limits, timeout, isolation)  # type: ignore[arg-type]


def start(seed: int = 1, question: str = "Do it.", environment: str = "", **row: Any) -> EpisodeStart:
    messages = [{"role": "user", "content": question}]
    return EpisodeStart(prompt_ids(question), seed, {"prompt": messages, **row}, messages, environment)


def tool_messages(episode: Any) -> list[str]:
    return [m["content"] for m in episode.messages if m["role"] == "tool"]


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_row_columns_reach_reset_with_their_types_and_get_reward_scores(isolation: str) -> None:
    """TRL passes the row's columns to ``reset`` as they are: IncrementEnv compares ints."""
    run = driver(trl_shaped.IncrementEnv, isolation)
    try:
        good, bad = run.run(
            [start(1, start=3, target=5), start(2, start=3, target=9)], replies(call("increment", step=2), "done")
        )
        assert tool_messages(good) == ["5"] and good.reward == 1.0 and good.unscorable is None
        assert bad.reward == 0.0 and bad.tool_calls["increment"] == 1
    finally:
        run.close()


def test_instances_are_pooled_and_reset_between_episodes_across_runs() -> None:
    """TRL constructs once and resets often: the second run reuses the first run's instances."""
    run = driver(trl_shaped.IncrementEnv, "thread")
    try:
        first = run.run([start(1, start=0, target=1)], replies("no call"))
        instance = run.views(first)[0]
        second = run.run([start(2, start=0, target=1)], replies("no call"))
        assert run.views(second)[0] is instance and instance.resets == 2
    finally:
        run.close()


def test_environment_owned_data_reset_gives_the_prompt() -> None:
    """No dataset: the row has no prompt and ``reset``'s text is the first user message."""
    run = driver(trl_shaped.OwnDataEnv)
    try:
        (episode,) = run.run([EpisodeStart([], 3, {}, [])], replies(call("guess", number=7), "ok"))
        assert episode.messages[0] == {"role": "user", "content": "Guess the secret number by calling guess."}
        assert episode.prompt_ids == run.turns[""].prompt_ids(episode.messages[:1])
        assert tool_messages(episode) == ["right"] and episode.reward == 1.0
    finally:
        run.close()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_async_tools_reset_and_get_reward_are_awaited(isolation: str) -> None:
    run = driver(trl_shaped.AsyncEnv, isolation)
    try:
        (episode,) = run.run([start()], replies(call("add", a=2, b=3), "5"))
        assert tool_messages(episode) == ["5"] and episode.reward == 5.0  # not "<coroutine object ...>"
    finally:
        run.close()


def test_a_tool_named_step_is_a_tool_and_numpy_true_is_a_reward() -> None:
    """Only ``reset`` and ``get_reward`` are reserved; ``get_reward`` returning ``np.True_`` scores 1.0."""
    run = driver(trl_shaped.GameEnv)
    try:
        (episode,) = run.run([start()], replies(call("step", direction="right"), "done"))
        assert tool_messages(episode) == ["position 1"] and episode.reward == 1.0 and episode.unscorable is None
    finally:
        run.close()


def test_a_text_environment_is_declared_by_subclassing() -> None:
    class Echo(TextEnvironment):
        def step(self, reply: str) -> tuple[str | None, bool]:
            return None, True

    assert load_environments(Echo).specs[""].has_step
    assert not load_environments(trl_shaped.GameEnv).specs[""].has_step


def test_a_tool_that_raises_is_an_error_the_model_reads_counted_per_tool() -> None:
    """TRL returns ``{"error": ...}`` to the model; the episode stays scorable (its mistake is a signal)."""
    run = driver(trl_shaped.DivideEnv)
    try:
        (episode,) = run.run([start()], replies(call("divide", a=1, b=0), call("divide", a=4, b=2), "2"))
        errors = tool_messages(episode)
        assert errors[0].startswith("error: divide raised ZeroDivisionError") and errors[1] == "2.0"
        assert episode.unscorable is None and episode.reward == 1.0  # True is 1.0, as float(True)
        stats = episode_stats([episode], ["divide"])
        assert stats["tool_errors/divide"] == 1 and stats["tool_calls_tool_exception"] == 1
        assert stats["tool_calls/divide"] == 1 and stats["environment_errors"] == 0
    finally:
        run.close()


def test_standalone_tools_with_and_without_an_environment() -> None:
    for environment in (None, trl_shaped.DivideEnv):
        run = driver(environment, tools=[trl_shaped.shout])
        try:
            (episode,) = run.run([start()], replies(call("shout", text="hi"), "ok"))
            assert tool_messages(episode) == ["HI"]
        finally:
            run.close()


def test_any_zero_argument_callable_is_a_factory() -> None:
    environments = load_environments(lambda: trl_shaped.IncrementEnv())
    assert environments.specs[""].tools == ("increment",)
    with pytest.raises(ConfigError, match=r"^--rollout\.environment_args .* is a factory"):
        load_environments(lambda: trl_shaped.IncrementEnv(), {"x": 1})


def test_a_mapping_of_environments_is_routed_by_the_environment_column_with_only_its_tools() -> None:
    run = driver({"count": trl_shaped.IncrementEnv, "div": trl_shaped.DivideEnv})
    try:
        count, div, lost = run.run(
            [start(1, environment="count", start=1, target=2), start(2, environment="div"), start(3, environment="x")],
            replies(call("increment", step=1), "done"),
        )
        assert count.reward == 1.0 and tool_messages(count) == ["2"]
        assert tool_messages(div)[0].startswith("error: unknown tool 'increment'")  # not among div's tools
        assert lost.fault_kind == "routing" and lost.unscorable is not None
        names = [s["function"]["name"] for s in run.schemas["div"]]
        assert names == ["divide"]
    finally:
        run.close()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_state_made_in_reset_is_there_for_the_tools(isolation: str) -> None:
    """One worker per episode for all of its calls: a thread-bound resource made in reset works in the tools."""
    run = driver(trl_shaped.ThreadBoundEnv, isolation)
    try:
        episodes = run.run([start(i) for i in range(3)], replies(call("check", x=1), "ok"))
        assert [tool_messages(e) for e in episodes] == [["same thread"]] * 3
    finally:
        run.close()


def test_a_call_past_the_timeout_is_cut_and_nothing_keeps_running() -> None:
    run = driver(trl_shaped.SlowToolEnv, timeout=0.5)
    try:
        began = time.monotonic()
        episodes = run.run(
            [start(1, question="slow"), start(2, question="fast")],
            ScriptedModel(
                lambda q, t: (call("wait", seconds=60) if "slow" in q else call("wait", seconds=0)) if t == 0 else "ok"
            ),
        )
        assert time.monotonic() - began < 10
        assert episodes[0].fault_kind == "timeout" and episodes[0].unscorable is not None
        assert episodes[1].unscorable is None and tool_messages(episodes[1]) == ["done"]
        pids = [w._process.pid for w in run.pool.workers if w._process is not None]  # noqa: SLF001
    finally:
        run.close()
    for pid in pids:  # every worker process is gone after close
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_reward_functions_see_the_instances_in_a_worker_process() -> None:
    run = driver(trl_shaped.IncrementEnv, "process")
    try:
        episodes = run.run([start(1, start=3, target=5)], replies(call("increment", step=4), "ok"))
        (view,) = run.views(episodes)
        assert isinstance(view, RemoteEnvironment) and view.counter == 7 and view.get_reward() == 0.0
    finally:
        run.close()


class HugeReward:
    """``get_reward`` returns an int too large for a float."""

    def reset(self, **kwargs: Any) -> None:
        return None

    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    def get_reward(self) -> int:
        return 10**400


def test_degenerate_model_output_and_environment_values_never_end_the_run() -> None:
    """What a degenerate policy sends (JSON nested thousands deep, an int of 5,000 digits) is a malformed call the
    model reads; a reward that does not fit a float is a counted fault of that episode."""
    nested = "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>"
    digits = '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}</tool_call>'
    run = driver(HugeReward, tokens=30000)
    try:
        script = ScriptedModel(lambda q, t: (nested if "deep" in q else digits) if t == 0 else "ok")
        deep, big = run.run([start(1, question="deep"), start(2, question="big")], script)
        for episode in (deep, big):
            assert tool_messages(episode)[0].startswith("error: malformed tool call")
            assert episode.fault_kind == "get_reward" and "does not fit a float" in str(episode.unscorable)
    finally:
        run.close()
