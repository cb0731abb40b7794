"""A transcript renders as the episode of the same conversation (issue 49), and a bad one is refused by kind.

Reference: the real :class:`EpisodeDriver` run on the conversation's prompt with a scripted ``generate`` that emits
the transcript's own assistant tokens turn by turn; the episode's ids and its training row's loss mask are what the
transcript must equal.
"""

from __future__ import annotations

from typing import Any

import pytest

from lit_fgrpo.environments import ChatTurns, EpisodeDriver, EpisodeLimits, EpisodeStart, load_environment, training_row
from lit_fgrpo.environments.calculator_transcripts import calculator_transcript, tool_call_text
from lit_fgrpo.environments.transcripts import TranscriptError, render_transcript
from tests.environments.tiny_chat import CHATML, chat_tokenizer

PROMPT = [
    {"role": "system", "content": "You are a careful calculator user."},
    {"role": "user", "content": "What is 123 * 45? Use a tool to compute it, then reply with just the number."},
]


def calculator_turns() -> ChatTurns:
    return ChatTurns(chat_tokenizer(), tools=load_environment("calculator").tool_schemas())


def replay(replies: list[list[int]]) -> Any:
    """A ``generate`` that answers the k-th call with the k-th reply's ids (one live episode per call)."""
    calls = iter(replies)

    def generate(prompts: list[list[int]], caps: list[int], seeds: list[int]) -> list[Any]:
        assert len(prompts) == 1
        return [(next(calls), None, True)]

    return generate


def run_episode(
    environment: str, args: dict[str, Any] | None, turns: ChatTurns, messages: list[dict[str, Any]], row: dict[str, Any]
) -> Any:
    """The episode the driver makes of the conversation's prompt, the model replaying its assistant messages."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = messages[:first]
    eot = turns.end_of_turn_id
    replies = [
        list(turns.tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + [eot]
        for m in messages
        if m["role"] == "assistant"
    ]
    driver = EpisodeDriver(
        load_environment(environment, args), turns, EpisodeLimits(max_turns=4, max_episode_tokens=512)
    )
    try:
        (episode,) = driver.run([EpisodeStart(turns.prompt_ids(prompt), 7, row, prompt)], replay(replies))
    finally:
        getattr(driver, "close", lambda: None)()
    return episode


def test_a_calculator_transcript_has_the_ids_and_loss_mask_of_its_episode() -> None:
    turns = calculator_turns()
    messages = calculator_transcript(PROMPT, 123, 45)["messages"]
    episode = run_episode("calculator", None, turns, messages, {"prompt": PROMPT[-1]["content"], "answer": "5535"})
    assert episode.tool_calls["multiply"] == 1 and episode.unscorable is None and not episode.truncated
    assert [m["content"] for m in episode.messages[len(PROMPT) :]] == [m["content"] for m in messages[len(PROMPT) :]]
    tokens = render_transcript(turns, messages)
    row = training_row(episode)
    assert tokens.prompt_ids == episode.prompt_ids
    assert tokens.ids == episode.token_ids()
    assert tokens.loss_mask == row.loss_mask  # the assistant's tokens, their end-of-turn token included
    trained = [t for t, m in zip(tokens.completion_ids, tokens.loss_mask) if m]
    eos = chat_tokenizer().eos_token
    assert chat_tokenizer().decode(trained) == f"{tool_call_text('multiply', {'a': 123, 'b': 45})}{eos}5535{eos}"


def test_a_text_environment_transcript_with_a_second_attempt_matches_its_episode() -> None:
    turns = ChatTurns(chat_tokenizer())
    question = "What is 2 + 3? Reply with just the number."
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "It is 6."},
        {"role": "user", "content": "Wrong, try again."},
        {"role": "assistant", "content": "5"},
    ]
    episode = run_episode("retry", {"max_attempts": 3}, turns, messages, {"prompt": question, "answer": "5"})
    assert episode.turns == 2
    tokens = render_transcript(turns, messages)
    assert tokens.ids == episode.token_ids() and tokens.loss_mask == training_row(episode).loss_mask


def test_messages_after_the_last_reply_carry_no_tokens_and_tool_names_are_filled_in() -> None:
    turns = calculator_turns()
    messages = calculator_transcript(PROMPT, 12, 7)["messages"]
    unnamed = [{k: v for k, v in m.items() if k != "name"} for m in messages]
    trailing = [*messages, {"role": "user", "content": "Thanks!"}]
    reference = render_transcript(turns, messages)
    assert render_transcript(turns, unnamed) == reference == render_transcript(turns, trailing)


def bad(kind: str, messages: list[dict[str, Any]], turns: ChatTurns | None = None, **kwargs: Any) -> str:
    with pytest.raises(TranscriptError) as info:
        render_transcript(turns or calculator_turns(), messages, **kwargs)
    assert info.value.kind == kind, str(info.value)
    return str(info.value)


def test_bad_transcripts_are_refused_with_their_kind_and_message_number() -> None:
    good = calculator_transcript(PROMPT, 12, 7)["messages"]
    call, tool, answer = good[2], good[3], good[4]
    assert "role 'function'" in bad("role", [*PROMPT, {**call, "role": "function"}])
    assert "message 3 (assistant): a tool call does not parse" in bad(
        "tool_call",
        [*PROMPT, {"role": "assistant", "content": "<tool_call>{multiply(12, 7)}</tool_call>"}, tool, answer],
    )
    assert "'divide'" in bad(
        "tool_call",
        [*PROMPT, {"role": "assistant", "content": tool_call_text("divide", {"a": 1, "b": 2})}, tool, answer],
    )
    assert "structured 'tool_calls'" in bad(
        "tool_call", [*PROMPT, {**call, "tool_calls": [{"name": "multiply"}]}, tool, answer]
    )
    assert "1 tool call(s), answered by 0" in bad("layout", [*PROMPT, call, answer])
    assert "tool message answering no call" in bad("layout", [*PROMPT, answer, tool, answer])
    assert "no assistant message" in bad("layout", PROMPT)
    assert "no user message" in bad("layout", [PROMPT[0], answer])
    assert "longer than the context (40)" in bad("too_long", good, max_length=40)


def test_a_template_that_cannot_render_a_tool_message_is_a_role_problem() -> None:
    tokenizer = chat_tokenizer()
    turns = calculator_turns()  # built (and its roles probed) with the plain template
    original = tokenizer.chat_template
    tokenizer.chat_template = CHATML.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if message['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}",
    )
    try:
        message = bad("role", calculator_transcript(PROMPT, 12, 7)["messages"], turns)
    finally:
        tokenizer.chat_template = original
    assert "the chat template cannot render the messages after message 3" in message and "no tool role" in message
