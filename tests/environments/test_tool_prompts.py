"""Tools in the prompt: through the chat template's own ``tools=`` when it renders them, else as the Hermes
instructions in the system message (:class:`lit_fgrpo.environments.ChatTurns` with ``tools``)."""

from __future__ import annotations

import copy

from lit_fgrpo.environments import ChatTurns, load_environment, tool_instructions
from tests.environments.tiny_chat import CHATML, chat_tokenizer

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
WITH_TOOLS = "{% if tools %}<|im_start|>system\nTOOLS {{ tools | tojson }}<|im_end|>\n{% endif %}" + CHATML


def text(turns: ChatTurns, messages: list[dict[str, str]]) -> str:
    return str(chat_tokenizer().decode(turns.prompt_ids(messages)))


def test_a_template_without_tool_syntax_gets_the_instructions_in_the_system_message() -> None:
    schemas = load_environment("calculator").tool_schemas()
    turns = ChatTurns(chat_tokenizer(), tools=schemas)
    assert not turns.template_renders_tools
    instructions = tool_instructions(schemas)
    assert text(turns, QUESTION).startswith(f"<|im_start|>system\n{instructions}<|im_end|>\n<|im_start|>user\n")
    with_system = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert text(turns, with_system).startswith(f"<|im_start|>system\nBe brief.\n\n{instructions}<|im_end|>")
    assert text(ChatTurns(chat_tokenizer()), QUESTION).startswith("<|im_start|>user\n")  # no tools: as rendered


def test_a_template_with_tool_syntax_renders_the_tools_itself() -> None:
    tokenizer = copy.deepcopy(chat_tokenizer())
    tokenizer.chat_template = WITH_TOOLS
    turns = ChatTurns(tokenizer, tools=load_environment("calculator").tool_schemas())
    assert turns.template_renders_tools
    rendered = str(tokenizer.decode(turns.prompt_ids(QUESTION)))
    assert rendered.startswith('<|im_start|>system\nTOOLS [{"type": "function", "function": {"name": "add"')
    assert "You may call" not in rendered and rendered.endswith("<|im_start|>assistant\n")
