"""The chat templates TRL ships, each either serving episodes or refused in one line naming what to set; and the
``--rollout.chat_template`` / ``--rollout.chat_template_kwargs`` settings.

References: the template's own rendering of a whole two-turn conversation (:func:`round_trip`), which must equal the
prompt, the model's turns and the derived environment parts put together; TRL's stored templates as they are on disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from lit_fgrpo.environments.chat_template import load_chat_template, template_kwargs, trl_training_template
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError
from tests.environments.tiny_chat import CHATML, templated_tokenizer

TRL_TEMPLATES = sorted((Path(pytest.importorskip("trl").__file__).parent / "chat_templates").glob("*.jinja"))
MARKER = re.compile(r"<[|｜]?[A-Za-z_▁][\w▁.\-]*[|｜]?>|\[/?[A-Z_]+\]")
"""Turn markers a template writes (``<|im_start|>``, ``<start_of_turn>``, ``<｜User｜>``, ``[INST]``)."""


def tokenizer_for(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return templated_tokenizer(text, MARKER.findall(text))


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False))


def round_trip(tokenizer: Any, turns: ChatTurns) -> None:
    """The template's rendering of [question, reply, user message, reply, tool message] is the prompt, then per model
    turn its text up to the end-of-turn token (what the model samples) and :meth:`ChatTurns.suffix_text`."""
    question = {"role": "user", "content": "What is 2 + 3?"}
    replies = ["The answer is 6.", "The answer is 5."]
    environment = [{"role": "user", "content": "Wrong, try again."}, {"role": "tool", "name": "add", "content": "5"}]
    thought = "<think>\n\n</think>\n\n"  # an empty thinking block: what templates that prefill <think> expect
    conversation = [question, {"role": "assistant", "content": thought + replies[0]}, environment[0]]
    conversation += [{"role": "assistant", "content": thought + replies[1]}, environment[1]]
    whole = render(tokenizer, conversation, generation_prompt=True)
    prompt = render(tokenizer, [question], generation_prompt=True)
    assert whole.startswith(prompt)
    rest = whole[len(prompt) :]
    for reply, message in zip(replies, environment):
        turn_end = rest.index(turns.end_of_turn, rest.index(reply) + len(reply)) + len(turns.end_of_turn)
        rest = rest[turn_end:]
        suffix = turns.suffix_text([message])
        assert rest.startswith(suffix)
        rest = rest[len(suffix) :]
    assert rest == ""


@pytest.mark.parametrize("path", TRL_TEMPLATES, ids=[p.name for p in TRL_TEMPLATES])
def test_every_template_trl_ships_serves_episodes_or_is_one_line_naming_what_to_set(path: Path) -> None:
    tokenizer = tokenizer_for(path)
    try:
        turns = ChatTurns(tokenizer)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message
        assert re.search(r"set --rollout\.(chat_template|end_of_turn|chat_template_kwargs)\b", message), message
        return
    assert tokenizer.convert_ids_to_tokens(turns.end_of_turn_id) == turns.end_of_turn
    round_trip(tokenizer, turns)


def template(name: str) -> Path:
    return next(p for p in TRL_TEMPLATES if p.name == name)


def test_qwen3_which_drops_earlier_thinking_is_refused_naming_trls_training_template() -> None:
    with pytest.raises(ConfigError, match=r"set --rollout\.chat_template \S+qwen3_training\.jinja ") as err:
        ChatTurns(tokenizer_for(template("qwen3.jinja")))
    assert "renders an assistant turn differently once a message follows it" in str(err.value)
    tokenizer = tokenizer_for(template("qwen3.jinja"))
    turns = ChatTurns(tokenizer, chat_template=str(template("qwen3_training.jinja")))  # the remedy it names
    tokenizer.chat_template = template("qwen3_training.jinja").read_text(encoding="utf-8")
    round_trip(tokenizer, turns)


def test_a_template_that_drops_the_thinking_of_every_earlier_turn_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"drops an earlier assistant turn's <think> block.*deepseek_r1_distill_tr"):
        ChatTurns(tokenizer_for(template("deepseek_r1_distill.jinja")))


def test_gemmas_end_of_turn_is_found_after_the_turns_text() -> None:
    tokenizer = tokenizer_for(template("gemma.jinja"))
    assert tokenizer.eos_token == "<|im_end|>"  # not what Gemma's template ends a turn with
    turns = ChatTurns(tokenizer, roles=("user",))  # Gemma's template refuses a tool role
    assert turns.end_of_turn == "<end_of_turn>"
    round_trip_user = turns.suffix_text([{"role": "user", "content": "Wrong."}])
    assert round_trip_user == "\n<start_of_turn>user\nWrong.<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(ConfigError, match=r"^--rollout\.end_of_turn='<eos>': the chat template does not end an"):
        ChatTurns(
            templated_tokenizer(template("gemma.jinja").read_text(), ["<eos>", "<end_of_turn>"]), "<eos>", ("user",)
        )


def test_the_chat_template_setting_is_template_text_or_a_file() -> None:
    assert load_chat_template(None) is None
    assert load_chat_template(CHATML) == CHATML
    assert load_chat_template(str(template("llama3.jinja"))) == template("llama3.jinja").read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^--rollout\.chat_template 'no/such\.jinja' is neither template text"):
        load_chat_template("no/such.jinja")


def test_template_kwargs_reach_every_rendering_and_may_not_set_the_episodes_own_arguments() -> None:
    thinking = CHATML.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n' + ('' if think else '<x>')")
    tokenizer = templated_tokenizer(thinking, ["<x>"])
    assert ChatTurns(tokenizer).suffix_text([]) == "\n<|im_start|>assistant\n<x>"
    turns = ChatTurns(tokenizer, chat_template_kwargs={"think": True})
    assert turns.suffix_text([]) == "\n<|im_start|>assistant\n"
    assert turns.renders_prompts  # the data module's prompts did not see the argument: the turns render them
    assert template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
    with pytest.raises(ConfigError, match=r"^--rollout\.chat_template_kwargs sets tools, which the episodes set"):
        template_kwargs({"tools": []})


def test_trls_training_template_is_found_by_the_templates_text() -> None:
    qwen3 = template("qwen3.jinja").read_text(encoding="utf-8")
    assert trl_training_template(qwen3) == template("qwen3_training.jinja")
    assert trl_training_template(template("lfm2_v2.jinja").read_text()) == template("lfm2_v2_training.jinja")
    assert trl_training_template(template("qwen3_training.jinja").read_text()) is None  # already one
    assert trl_training_template(CHATML) is None
