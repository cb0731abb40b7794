"""The tokens between model turns, from the chat template.

References: the ChatML text written out by hand; and the template's own rendering of a whole conversation, tokenised
in one piece, which must equal prompt + reply + end-of-turn + the derived environment tokens.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError
from tests.environments.tiny_chat import chat_tokenizer

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
    with pytest.raises(ConfigError, match=r"cannot render a tool message after an assistant turn: no tool role$"):
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
