"""The tokens between two model turns, from the tokenizer's chat template.

Token-in/token-out: the model's own tokens are never decoded and encoded again (a round trip can change them: BPE
merges ``h`` + ``ello`` into ``hello``, and the log-prob ratio of the changed tokens is then wrong). Only what the
environment says is tokenised, together with the template's turn markers around it. For ChatML (SmolLM2, Qwen),
after a model turn that ended with its stop token ``<|im_end|>`` the environment's part is::

    \\n<|im_start|>user\\nWrong, try again.<|im_end|>\\n<|im_start|>assistant\\n

:class:`ChatTurns` derives it from the template itself, as TRL's ``_get_tool_suffix_ids`` does: render a fixed
two-message conversation (user, assistant) without and with the new messages (and the next generation prompt), cut
the first rendering right after the assistant's end-of-turn token (the stop token the model samples itself), and
tokenise the difference. Templates that wrap tool results in a user turn (Qwen2.5's ``<tool_response>``) or need the
tool's name are handled by the template, since it renders the messages itself.

Tools reach the prompt the template's way when it has one (``apply_chat_template(..., tools=schemas)``, as Qwen's
does); a template that ignores ``tools`` (SmolLM2's) gets the plain Hermes instructions
(:func:`~lit_fgrpo.environments.tools.tool_instructions`) in the system message instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_fgrpo.environments.base import ENVIRONMENT_FLAG
from lit_fgrpo.environments.call_formats import ToolCallFormat
from lit_fgrpo.environments.call_formats import call_format as format_named
from lit_fgrpo.errors import ConfigError

_SENTINEL = "\u2063env-turn-probe\u2063"
"""The probe conversation's assistant content: a string no template writes itself."""


class ChatTurns:
    """Token ids of environment and tool messages between model turns, from a Hugging Face tokenizer's chat template.

    Args:
        tokenizer: A tokenizer with a chat template.
        end_of_turn: The token text the model ends its turn with (default the EOS token, ``<|im_end|>`` for ChatML).
        roles: The roles the environment will speak in; each is rendered once here, so that a template that cannot
            render one (some refuse a ``tool`` role or two user turns in a row) fails before the first step.
        tools: The environment's tool schemas: every prompt (:meth:`prompt_ids`) lists them, through the template
            when it renders ``tools``, else as instructions in the system message (:meth:`prompt_messages`).

    Raises:
        ConfigError: Naming ``--rollout.environment`` when the tokenizer has no chat template, the template does not
            end an assistant turn with ``end_of_turn``, renders a later turn by changing an earlier one, or cannot
            render a role.
    """

    def __init__(
        self,
        tokenizer: Any,
        end_of_turn: str | None = None,
        roles: Sequence[str] = ("user", "tool"),
        tools: Sequence[Mapping[str, Any]] = (),
        call_format: ToolCallFormat = "hermes",
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{ENVIRONMENT_FLAG}: multi-turn episodes need a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.call_format = format_named(call_format)
        """How the model writes a tool call: ``call_format.parse(reply, schemas)`` reads a reply's calls."""
        self.end_of_turn = str(end_of_turn if end_of_turn is not None else tokenizer.eos_token)
        self._probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL}]
        rendered = self._render(self._probe, generation_prompt=False)
        content_end = rendered.rfind(_SENTINEL) + len(_SENTINEL)
        stop = rendered.find(self.end_of_turn, content_end)
        if stop < 0:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template does not end an assistant turn with {self.end_of_turn!r} "
                "(the token the model stops at)"
            )
        self._prefix = rendered[: stop + len(self.end_of_turn)]
        """The probe rendered up to and including the assistant's end-of-turn token."""
        ids = list(tokenizer(self.end_of_turn, add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            raise ConfigError(f"{ENVIRONMENT_FLAG}: the end-of-turn text {self.end_of_turn!r} is not one token: {ids}")
        self.end_of_turn_id = int(ids[0])
        """The token that closes a model turn; appended (outside the loss) after a turn that stopped at another one."""
        for role in roles:
            self.suffix_text([{"role": role, "content": "probe"}])
        self.tools = [dict(schema) for schema in tools]
        """The tool schemas every prompt lists (none: prompts as the data module rendered them)."""
        self.template_renders_tools = bool(self.tools) and self._renders_tools()
        """Whether the template writes the tools itself; if not, the instructions go into the system message."""

    def _renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "?"}]
        try:
            with_tools = self._render(probe, generation_prompt=True, tools=self.tools)
        except Exception:  # a template that refuses the argument has no tool syntax of its own
            return False
        return with_tools != self._render(probe, generation_prompt=True)

    def _render(
        self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        kwargs = {"tools": tools} if tools else {}
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=generation_prompt, tokenize=False, **kwargs
            )
        )

    def suffix_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The text after a model turn's stop token: the messages in their turn markers, then the generation prompt.

        Raises:
            ConfigError: If the template cannot render the messages, or renders the turns before them differently once
                they are there (the difference is then not a suffix).
        """
        try:
            full = self._render([*self._probe, *messages], generation_prompt=True)
        except Exception as err:  # jinja's TemplateError, or raise_exception() inside the template
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template cannot render a {roles} message after an assistant turn: {err}"
            ) from None
        if not full.startswith(self._prefix):
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template renders an assistant turn differently once a message follows "
                "it, so its tokens cannot be continued"
            )
        return full[len(self._prefix) :]

    def suffix_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids to append after a model turn that ended with its stop token: ``messages`` and the next
        generation prompt. An empty ``messages`` gives the markers of a new assistant turn alone."""
        return list(self.tokenizer(self.suffix_text(messages), add_special_tokens=False)["input_ids"])

    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A prompt's messages as the model sees them: with the tool instructions in the system message when there
        are tools and the template does not write them itself (a system message is added when there is none)."""
        out = [dict(m) for m in messages]
        if not self.tools or self.template_renders_tools:
            return out
        instructions = self.call_format.instructions(self.tools)
        if out and out[0].get("role") == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{instructions}"
        else:
            out.insert(0, {"role": "system", "content": instructions})
        return out

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A prompt's token ids: the template with the generation prompt (and the tools, see
        :meth:`prompt_messages`), tokenised without added special tokens (as
        :func:`lit_fgrpo.data.records.render_records` tokenises templated prompts)."""
        tools = self.tools if self.template_renders_tools else None
        text = self._render(self.prompt_messages(messages), generation_prompt=True, tools=tools)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """A model turn's text for the environment to read (special tokens dropped); its ids stay as sampled."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
