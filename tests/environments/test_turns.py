"""The tokens between model turns, from the chat template.

References: the ChatML text written out by hand; and the template's own rendering of a whole conversation, tokenised
in one piece, which must equal prompt + reply + end-of-turn + the derived environment tokens.
"""

from __future__ import annotations

import copy
import datetime as real_datetime
from pathlib import Path

import pytest

from lit_fgrpo.environments.faults import EnvironmentFault
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError
from tests.environments.tiny_chat import CHATML, chat_tokenizer, templated_tokenizer

SMOLLM2 = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct"

QWEN_LIKE = (  # Qwen2.5's way with tool results: consecutive tool messages share one user turn in <tool_response>s
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def whole_conversation_ids(tokenizer, reply: str, messages: list[dict[str, str]]) -> list[int]:  # type: ignore[no-untyped-def]
    conversation = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": reply}, *messages]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assembled_ids(tokenizer, turns: ChatTurns, reply: str, messages: list[dict[str, str]]) -> list[int]:  # type: ignore[no-untyped-def]
    prompt = turns.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
    reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
    return prompt + reply_ids + [turns.end_of_turn_id] + turns.suffix_ids(messages)


def test_chatml_markers_around_a_user_message() -> None:
    tokenizer = chat_tokenizer()
    turns = ChatTurns(tokenizer)
    message = [{"role": "user", "content": "Wrong, try again."}]
    assert turns.suffix_text(message) == "\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"
    assert turns.suffix_ids(message) == tokenizer(turns.suffix_text(message), add_special_tokens=False)["input_ids"]
    assert turns.suffix_text([]) == "\n<|im_start|>assistant\n"  # no observation: a new assistant turn alone
    assert turns.end_of_turn_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Wrong, try again."}],
        [{"role": "tool", "content": "5"}, {"role": "tool", "content": "error: unknown tool 'x'"}],
    ],
)
def test_assembled_tokens_equal_the_templates_whole_rendering(messages: list[dict[str, str]]) -> None:
    tokenizer = chat_tokenizer()
    turns = ChatTurns(tokenizer)
    assert assembled_ids(tokenizer, turns, "The answer is 5.", messages) == whole_conversation_ids(
        tokenizer, "The answer is 5.", messages
    )


def test_a_template_that_wraps_tool_results_renders_them_its_way() -> None:
    tokenizer = copy.copy(chat_tokenizer())
    tokenizer.chat_template = QWEN_LIKE
    turns = ChatTurns(tokenizer)
    tools = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "84"}]
    assert turns.suffix_text(tools) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n84\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert assembled_ids(tokenizer, turns, "Calling.", tools) == whole_conversation_ids(tokenizer, "Calling.", tools)


def test_the_model_text_for_the_environment_drops_special_tokens() -> None:
    tokenizer = chat_tokenizer()
    ids = list(tokenizer("The answer is 5.", add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    assert ChatTurns(tokenizer).decode(ids) == "The answer is 5."


def test_templates_that_cannot_serve_are_one_line_naming_the_setting() -> None:
    plain = copy.copy(chat_tokenizer())
    plain.chat_template = None
    with pytest.raises(ConfigError, match=r"^--rollout\.environment: multi-turn episodes need a tokenizer with a chat"):
        ChatTurns(plain)
    other_end = copy.copy(chat_tokenizer())
    other_end.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    with pytest.raises(ConfigError, match=r"does not end an assistant turn with '<\|im_end\|>'"):
        ChatTurns(other_end)
    no_tools = copy.copy(chat_tokenizer())
    no_tools.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    assert ChatTurns(no_tools, roles=("user",)).suffix_text([])  # fine for a text environment
    with pytest.raises(ConfigError, match=r"cannot render a tool message after an assistant turn: no tool role; set "):
        ChatTurns(no_tools)


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").is_file(), reason="SmolLM2 not imported (bash scripts/setup.sh)")
def test_smollm2s_own_template() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    turns = ChatTurns(tokenizer)
    message = [{"role": "user", "content": "Wrong, try again."}]
    assert turns.suffix_text(message) == "\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"
    assert assembled_ids(tokenizer, turns, "2 + 3 = 5", message) == whole_conversation_ids(
        tokenizer, "2 + 3 = 5", message
    )
    tool = [{"role": "tool", "content": "5"}]
    assert tokenizer.convert_ids_to_tokens(turns.suffix_ids(tool)) == [
        "Ċ", "<|im_start|>", "tool", "Ċ", "5", "<|im_end|>", "Ċ", "<|im_start|>", "ass", "istant", "Ċ"
    ]  # fmt: skip


class Calendar:
    """Stands in for ``datetime.datetime`` where transformers' ``strftime_now`` reads the time: a day set by hand."""

    today = real_datetime.datetime(2026, 12, 5, 23, 59, 59)

    @classmethod
    def now(cls) -> real_datetime.datetime:
        return cls.today


DATED = "{{ '<|im_start|>system\nToday is ' + strftime_now('%d %b %Y') + '<|im_end|>\n' }}" + CHATML


def test_a_template_that_writes_the_date_still_matches_itself_after_midnight(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.utils.chat_template_utils as jinja_utils

    monkeypatch.setattr(jinja_utils, "datetime", Calendar)
    tokenizer = templated_tokenizer(DATED)
    turns = ChatTurns(tokenizer)  # built on 5 Dec
    probe = [{"role": "user", "content": "?"}]
    before = tokenizer.apply_chat_template(probe, tokenize=False)
    monkeypatch.setattr(Calendar, "today", real_datetime.datetime(2026, 12, 6, 0, 0, 1))
    assert tokenizer.apply_chat_template(probe, tokenize=False) != before  # the reference: the rendering changed
    message = [{"role": "user", "content": "Wrong, try again."}]
    assert turns.suffix_text(message) == "\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"


PICKY = (  # refuses one tool result at run time, as a template may refuse content it cannot show
    "{% for m in messages %}{% if 'FORBIDDEN' in m['content'] %}{{ raise_exception('cannot show that') }}{% endif %}"
    "{% endfor %}" + CHATML
)


def test_a_template_that_fails_at_run_time_faults_that_episode_not_the_run() -> None:
    turns = ChatTurns(templated_tokenizer(PICKY))  # the probes render: the template is fine for episodes
    assert turns.suffix_text([{"role": "tool", "content": "5"}]) == (
        "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(EnvironmentFault, match=r"^the chat template cannot render a tool message after an assistant "):
        turns.suffix_ids([{"role": "tool", "content": "FORBIDDEN"}])
    with pytest.raises(EnvironmentFault, match=r"^the chat template cannot render the prompt: cannot show that$"):
        turns.prompt_ids([{"role": "user", "content": "FORBIDDEN"}])


def test_a_template_that_changes_an_earlier_turn_at_run_time_faults_that_episode() -> None:
    moody = "{% if messages | length > 3 %}{{ 'LONG ' }}{% endif %}" + CHATML  # checked with 3 messages, fine
    turns = ChatTurns(templated_tokenizer(moody))
    with pytest.raises(EnvironmentFault, match=r"renders an assistant turn differently once a message follows it"):
        turns.suffix_text([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% endfor %}" + CHATML
)


def test_tool_instructions_go_to_the_first_user_message_when_the_template_refuses_a_system_message() -> None:
    schemas = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    turns = ChatTurns(templated_tokenizer(NO_SYSTEM), tools=schemas, call_format="llama3_json")
    instructions = turns.call_format.instructions(schemas)
    assert '"parameters": <args-json-object>' in instructions  # the run's format, not Hermes
    assert turns.prompt_messages([{"role": "user", "content": "What is 2 + 3?"}]) == [
        {"role": "user", "content": f"{instructions}\n\nWhat is 2 + 3?"}
    ]
    assert turns.call_format.parse('{"name": "add", "parameters": {}}', schemas)[0].name == "add"
