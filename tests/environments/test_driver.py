"""The batched driver with a scripted stand-in for the engine (:class:`tests.environments.tiny_chat.ScriptedModel`).

References: token sequences assembled by hand from the tokenizer and the template's markers; the seeds and caps each
``generate`` call must receive; the reason and the counts each limit and each fault must leave.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from lit_fgrpo.environments import (
    ChatTurns,
    EpisodeDriver,
    EpisodeLimits,
    EpisodeStart,
    TextEnvironment,
    episode_stats,
    load_environment,
    training_row,
    turn_seed,
)
from lit_fgrpo.environments.episode import Episode
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer, prompt_ids

QUESTION = "What is 2 + 3? Reply with just the number."
EOS = chat_tokenizer().eos_token_id


def encode(text: str) -> list[int]:
    return list(chat_tokenizer()(text, add_special_tokens=False)["input_ids"])


def start(seed: int = 11, question: str = QUESTION, answer: str = "5") -> EpisodeStart:
    return EpisodeStart(prompt_ids(question), seed, {"prompt": question, "answer": answer})


def driver(
    env: Any = "retry", args: dict[str, Any] | None = None, timeout: float | None = None, **limits: Any
) -> EpisodeDriver:
    factory = load_environment(env, args)
    return EpisodeDriver(factory, ChatTurns(chat_tokenizer()), EpisodeLimits(**limits), call_timeout=timeout)


def by_turn(*replies: str) -> ScriptedModel:
    return ScriptedModel(lambda question, turn: replies[min(turn, len(replies) - 1)])


def test_a_two_turn_episode_is_assembled_token_in_token_out() -> None:
    model = by_turn("It is 6.", "5")
    (episode,) = driver().run([start()], model)
    turns = ChatTurns(chat_tokenizer())
    first, feedback, second = (
        encode("It is 6.") + [EOS],
        turns.suffix_ids([{"role": "user", "content": "Wrong, try again."}]),
        encode("5") + [EOS],
    )
    assert episode.token_ids() == prompt_ids(QUESTION) + first + feedback + second
    row = training_row(episode)
    assert row.loss_mask == [1] * len(first) + [0] * len(feedback) + [1] * len(second)
    seeds = [turn_seed(11, 0), turn_seed(11, 1)]
    expected_logp = [-((seeds[0] % 97) + 1 + k) / 100 for k in range(len(first))]
    expected_logp += [0.0] * len(feedback) + [-((seeds[1] % 97) + 1 + k) / 100 for k in range(len(second))]
    assert row.sampling_logprobs == expected_logp
    assert [call[2] for call in model.calls] == [[seeds[0]], [seeds[1]]]
    assert row.messages == [
        {"role": "assistant", "content": "It is 6."},
        {"role": "user", "content": "Wrong, try again."},
        {"role": "assistant", "content": "5"},
    ]
    assert (episode.end_reason, episode.truncated, episode.reward, episode.unscorable) == ("done", False, 0.5, None)


def test_the_models_tokens_are_kept_even_where_a_round_trip_would_change_them() -> None:
    tokenizer = chat_tokenizer()
    spelled = [tokenizer.convert_tokens_to_ids(ch) for ch in "Wrong"]  # W r o n g, one id each
    assert encode(tokenizer.decode(spelled)) != spelled  # the reference: decode + encode merges them
    model = ScriptedModel(lambda q, turn: "5", ids=lambda q, turn: spelled + [EOS] if turn == 0 else None)
    (episode,) = driver().run([start()], model)
    assert episode.segments[0].ids == spelled + [EOS]
    assert episode.token_ids()[len(prompt_ids(QUESTION)) :][: len(spelled) + 1] == spelled + [EOS]
    assert episode.messages[0] == {"role": "assistant", "content": "Wrong"}  # the environment read the text


def test_in_lockstep_all_live_episodes_advance_together_one_generate_call_per_turn() -> None:
    model = ScriptedModel(lambda question, turn: "5" if "2 + 3" in question or turn == 2 else "7")
    starts = [start(1), start(2, "What is 4 + 4?", "8"), start(3), start(4, "What is 1 + 1?", "2")]
    episodes = driver().run(starts, model, lockstep=True)
    assert [len(call[0]) for call in model.calls] == [4, 2, 2]  # every live episode in each call, none twice
    assert [e.turns for e in episodes] == [1, 3, 1, 3]
    assert [e.reward for e in episodes] == [1.0, 0.0, 1.0, 0.0]
    assert [call[2] for call in model.calls][1] == [turn_seed(2, 1), turn_seed(4, 1)]
    stats = episode_stats(episodes)
    assert stats["turns_per_episode"] == 2.0 and stats["episodes_truncated"] == 0.0
    joined: list[int] = []  # a shared engine's rank makes max_turns rounds: those it did not need, it joins
    driver(max_turns=5).run(starts, model, join=lambda: joined.append(1), lockstep=True)
    assert len(joined) == 5 - 3


def test_what_an_episode_gets_does_not_depend_on_the_batch_layout() -> None:
    model = ScriptedModel(lambda question, turn: "5" if turn == 1 else "6")
    alone = driver().run([start(5)], model)[0]
    crowded = driver().run([start(9, "What is 1 + 1?", "2"), start(7), start(5)], model)[2]
    assert training_row(alone) == training_row(crowded)


@pytest.mark.parametrize(
    ("limits", "reply", "reason", "turns", "attempts"),
    [
        ({"max_turns": 2}, "7", "max_turns", 2, 2),
        ({"max_turns": 2, "max_turn_tokens": 3}, "7", "max_turns", 2, 2),  # the cap is the model's, not the feedback's
        ({"max_turn_tokens": 3}, "The answer is 7.", "turn cut at max tokens", 1, 1),
        ({"max_episode_tokens": 30}, "7", "token budget", 2, 2),
    ],
)
def test_a_limit_ends_the_episode_truncated(
    limits: dict[str, int], reply: str, reason: str, turns: int, attempts: int
) -> None:
    model = by_turn(reply)
    (episode,) = driver(**limits).run([start()], model)
    assert (episode.end_reason, episode.truncated, episode.turns) == (reason, True, turns)
    assert episode.num_completion_tokens <= limits.get("max_episode_tokens", 256)
    assert episode.segments[-1].role == "assistant"  # no environment tokens after the last model turn
    assert episode.reward == 0.0  # the environment still judged every reply it was given
    assert training_row(episode, mask_truncated=True).loss_mask == [0] * episode.num_completion_tokens


def test_a_cut_turn_is_cut_at_its_cap_and_the_caps_are_sent() -> None:
    model = by_turn("The answer is 7.")
    (episode,) = driver(max_turn_tokens=3, max_episode_tokens=20).run([start()], model)
    assert episode.segments[0].ids == encode("The answer is 7.")[:3]
    assert model.calls[0][1] == [3]


def test_a_prompt_that_fills_the_context_ends_at_once() -> None:
    model = by_turn("5")
    (episode,) = driver(max_context=len(prompt_ids(QUESTION))).run([start()], model)
    assert (episode.end_reason, episode.truncated, episode.turns, model.calls) == (
        "prompt fills the context",
        True,
        0,
        [],
    )


def test_a_turn_that_stopped_at_another_stop_token_gets_the_end_of_turn_outside_the_loss() -> None:
    stop = encode("!")[0]

    def generate(prompts: list[list[int]], caps: list[int], seeds: list[int]) -> list[tuple[list[int], None, bool]]:
        return [(encode("7!"), None, True) for _ in prompts]

    (episode,) = driver(max_turns=2).run([start()], generate)
    assert episode.segments[0].ids[-1] == stop
    assert episode.segments[1].ids[0] == EOS and episode.segments[1].role == "user"
    assert training_row(episode).sampling_logprobs is None


class TRLStyle:
    """Written for TRL's environment_factory: reset(**row) returning text, tool methods, get_reward; no base class."""

    def reset(self, **kwargs: Any) -> str | None:
        self.target = int(kwargs["answer"])
        self.total = 0
        return " Use the tools."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.total = a + b
        return self.total

    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0


def test_a_trl_environment_factory_class_runs_unchanged() -> None:
    import inspect

    factory = load_environment(TRLStyle)
    trl_tools = [  # TRL 1.16's own discovery (grpo_trainer.py), verbatim
        name
        for name, _ in inspect.getmembers(TRLStyle, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]
    assert list(factory.tools) == trl_tools == ["add"]
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    model = by_turn(call, "It is 5.")
    turns = ChatTurns(chat_tokenizer())
    prompt = [{"role": "user", "content": QUESTION}]
    spec = EpisodeStart(prompt_ids(QUESTION), 3, {"prompt": QUESTION, "answer": "5"}, messages=prompt)
    (episode,) = EpisodeDriver(factory, turns, EpisodeLimits()).run([spec], model)
    assert episode.prompt_ids == turns.prompt_ids([{"role": "user", "content": QUESTION + " Use the tools."}])
    tool_message = turns.suffix_ids([{"role": "tool", "name": "add", "content": "5"}])
    assert episode.completion_ids == encode(call) + [EOS] + tool_message + encode("It is 5.") + [EOS]
    assert (episode.reward, episode.end_reason, dict(episode.tool_calls)) == (1.0, "no tool call", {"add": 1})
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]


def test_calculator_calls_and_every_kind_of_bad_call_are_answered_and_counted() -> None:
    replies = [
        '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 7}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        "<tool_call>multiply 12 7</tool_call>",
        '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 2}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        "It is 84.",
    ]
    (episode,) = driver("calculator", max_turns=6, max_episode_tokens=1024).run([start()], by_turn(*replies))
    tools = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert tools == [
        "84",
        "3",
        'error: malformed tool call: not JSON (Expecting value at character 0). Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>',
        "error: unknown tool 'divide'; the tools are: add, multiply",
        "error: bad arguments for 'add': missing required argument 'b'",
    ]
    assert [s.role for s in episode.segments] == ["assistant", "tool"] * 4 + ["assistant"]
    assert (episode.end_reason, episode.truncated, episode.unscorable) == ("no tool call", False, None)
    stats = episode_stats([episode, Episode([1], 0)], tools=("add", "multiply"))
    assert stats["tool_calls_valid"] == 2 and stats["tool_calls_invalid"] == 3
    assert stats["tool_calls/add"] == stats["tool_calls/multiply"] == 1
    assert (stats["tool_calls_malformed"], stats["tool_calls_unknown_tool"], stats["tool_calls_bad_arguments"]) == (
        1,
        1,
        1,
    )
    assert stats["turns_per_episode"] == 2.5
    idle = episode_stats([], tools=("add",))
    assert idle["tool_calls/add"] == 0.0  # a tool never called shows as 0, not as a missing key


class Faulty(TextEnvironment):
    """Breaks where ``mode`` says; the other episodes of the batch must not notice."""

    def __init__(self, mode: str = "") -> None:
        if mode == "init":
            raise RuntimeError("no sandbox")
        self.mode = mode

    def reset(self, **row: Any) -> Any:
        if self.mode == "reset":
            raise ValueError("bad row")
        return 42 if self.mode == "reset_type" else None

    def step(self, reply: str) -> Any:
        if self.mode == "step":
            raise ZeroDivisionError("division by zero")
        if self.mode == "step_slow":
            time.sleep(1.0)
        if self.mode == "step_shape":
            return "done"
        return "Again.", False

    def poke(self, x: int) -> int:
        """Poke.

        Args:
            x: How hard.
        """
        if self.mode == "tool":
            raise OSError("disk full")
        if self.mode == "tool_slow":
            time.sleep(1.0)
        return x

    def get_reward(self) -> float:
        if self.mode == "reward":
            raise KeyError("score")
        return math.nan if self.mode == "reward_nan" else 0.25


POKE = '<tool_call>{"name": "poke", "arguments": {"x": 1}}</tool_call>'


@pytest.mark.parametrize(
    ("mode", "reply", "reason"),
    [
        ("init", "5", "the environment's constructor raised RuntimeError: no sandbox"),
        ("reset", "5", "reset raised ValueError: bad row"),
        ("reset_type", "5", "reset returned an observation of type int, expected str or None"),
        ("step", "5", "step raised ZeroDivisionError: division by zero"),
        ("step_slow", "5", "step timed out"),
        ("step_shape", "5", "step returned 'done', expected (observation: str | None, done: bool)"),
        ("tool_slow", POKE, "tool 'poke' timed out"),
        ("reward", "5", "get_reward raised KeyError: 'score'"),
        ("reward_nan", "5", "get_reward returned nan, expected a finite number"),
    ],
)
def test_an_environment_fault_makes_its_episode_unscorable_never_zero(mode: str, reply: str, reason: str) -> None:
    faulty = driver(Faulty, {"mode": mode}, timeout=0.2, max_turns=2)
    fine = driver(Faulty, {"mode": ""}, timeout=0.2, max_turns=2)
    model = by_turn(reply)
    broken = faulty.run([start(1)], model)[0]
    other = fine.run([start(1)], model)[0]
    assert broken.unscorable == reason and broken.end_reason == reason and broken.ended
    assert broken.reward is None and broken.fault_kind is not None
    row = training_row(broken)
    assert row.unscorable == reason and set(row.loss_mask) <= {0}
    assert episode_stats([broken, other])["environment_errors"] == 1.0
    assert other.unscorable is None and other.reward == 0.25


def test_a_fault_in_one_episode_leaves_the_others_of_its_batch_alone() -> None:
    class Picky(TextEnvironment):
        def reset(self, answer: str, **row: Any) -> None:
            self.answer = answer

        def step(self, reply: str) -> tuple[str | None, bool]:
            if self.answer == "boom":
                raise RuntimeError("checker crashed")
            return None, True

        def get_reward(self) -> float:
            return 1.0

    episodes = driver(Picky).run([start(1), start(2, answer="boom"), start(3)], by_turn("5"))
    assert [e.unscorable for e in episodes] == [None, "step raised RuntimeError: checker crashed", None]
    assert [e.reward for e in episodes] == [1.0, None, 1.0]


def test_a_step_without_observation_lets_the_model_go_on_in_a_new_turn() -> None:
    class Patient(TextEnvironment):
        def reset(self, **row: Any) -> None:
            self.replies = 0

        def step(self, reply: str) -> tuple[str | None, bool]:
            self.replies += 1
            return None, self.replies == 2

    run = driver(Patient)
    (episode,) = run.run([start()], by_turn("Hmm.", "5"))
    assert episode.segments[1].ids == ChatTurns(chat_tokenizer()).suffix_ids([])  # the assistant markers alone
    assert [m["role"] for m in episode.messages] == ["assistant", "assistant"]
    assert set(run.seconds) == {"generate", "environment", "driver"} and min(run.seconds.values()) >= 0


def test_a_reset_observation_on_a_left_truncated_prompt_is_a_counted_fault() -> None:
    (episode,) = driver(TRLStyle).run([start()], by_turn("5"))  # no messages: the prompt was cut on the left
    assert episode.fault_kind == "reset" and "cut on the left" in str(episode.unscorable)
    assert episode_stats([episode])["environment_errors/reset"] == 1.0
