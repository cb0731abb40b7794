"""The tokens between two model turns, from the chat template.

Token-in/token-out: the model's own tokens are never decoded and encoded again (a round trip can change them: BPE
merges ``h`` + ``ello`` into ``hello``, and the log-prob ratio of the changed tokens is then wrong). Only what the
environment says is tokenised, together with the template's turn markers around it. For ChatML (SmolLM2, Qwen),
after a model turn that ended with its stop token ``<|im_end|>`` the environment's part is::

    \\n<|im_start|>user\\nWrong, try again.<|im_end|>\\n<|im_start|>assistant\\n

:class:`ChatTurns` derives it from the template itself, as TRL's ``_get_tool_suffix_ids`` does: render a fixed
two-message conversation (user, assistant) without and with the new messages (and the next generation prompt), cut
the first rendering right after the assistant's end-of-turn token, and tokenise the difference. Both renderings are
made in the same call, every time: a template that writes the date (Llama 3.1's ``strftime_now``) still matches
itself after midnight. How tool results are wrapped (Qwen2.5's ``<tool_response>``) is the template's business.

The template is checked once, when the turns are built (each problem a :class:`~lit_fgrpo.errors.ConfigError` line
naming what to set): a plain-text assistant turn, the token ending it (EOS, else the special token right after the
turn's text: Gemma's ``<end_of_turn>``), every role the environment speaks in rendered (not refused, not dropped)
without changing the turn before it, an earlier turn's ``<think>`` block kept (Qwen3's template drops it). A template
that fails later, on one episode's messages, raises :class:`~lit_fgrpo.environments.faults.EnvironmentFault`: that
episode is unscorable, the run goes on.

Tools reach the prompt the template's way when it has one (``tools=schemas``, as Qwen's); else the call format's
instructions go into the system message (SmolLM2's), or the first user message when the template refuses a system one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_fgrpo.environments.base import ENVIRONMENT_FLAG
from lit_fgrpo.environments.call_formats import ToolCallFormat
from lit_fgrpo.environments.call_formats import call_format as format_named
from lit_fgrpo.environments.chat_template import (
    CHAT_TEMPLATE_FLAG,
    END_OF_TURN_FLAG,
    load_chat_template,
    one_line,
    remedy,
    template_kwargs,
    token_at,
)
from lit_fgrpo.environments.faults import EnvironmentFault
from lit_fgrpo.errors import ConfigError

_SENTINEL = "\u2063env-turn-probe\u2063"
"""The probe conversation's assistant content: a string no template writes itself."""
_PROBE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL})
_MESSAGE = "\u2063env-message-probe\u2063"
"""The content of a role's probe message: a template that drops the message is caught by its absence."""
_THOUGHT = "\u2063env-thought-probe\u2063"
"""Inside an earlier assistant turn's ``<think>`` block: a template that drops earlier thinking is caught."""


class ChatTurns:
    """Token ids of environment and tool messages between model turns, from a Hugging Face tokenizer's chat template.

    Args:
        tokenizer: A tokenizer (with a chat template, unless ``chat_template`` gives one).
        end_of_turn: The token text the model ends its turn with (``--rollout.end_of_turn``); default the EOS token
            when the template ends an assistant turn with it, else the special token right after the turn's text.
        roles: The roles the environment will speak in; each is rendered once here (some templates refuse a
            ``tool`` role), so that the run fails before the first step.
        tools: The environment's tool schemas: every prompt (:meth:`prompt_ids`) lists them, through the template
            when it renders ``tools``, else as the call format's instructions (:meth:`prompt_messages`).
        call_format: How the model writes a tool call (``--rollout.tool_call_format``).
        chat_template: Template text, or a jinja file, replacing the tokenizer's (``--rollout.chat_template``).
        chat_template_kwargs: Passed to every ``apply_chat_template`` call (``--rollout.chat_template_kwargs``, e.g.
            ``{"enable_thinking": False}``).

    Raises:
        ConfigError: One line naming the setting when the template cannot serve episodes (see the module).
    """

    def __init__(
        self,
        tokenizer: Any,
        end_of_turn: str | None = None,
        roles: Sequence[str] = ("user", "tool"),
        tools: Sequence[Mapping[str, Any]] = (),
        call_format: ToolCallFormat = "hermes",
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = load_chat_template(chat_template)
        """The template text replacing the tokenizer's (``None``: the tokenizer's own)."""
        template = self.chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: multi-turn episodes need a tokenizer with a chat template (or {CHAT_TEMPLATE_FLAG})"
            )
        self.template = str(template)
        """The template text in use."""
        self.template_kwargs = template_kwargs(chat_template_kwargs)
        """Passed to every ``apply_chat_template`` call."""
        self.call_format = format_named(call_format)
        """How the model writes a tool call: ``call_format.parse(reply, schemas)`` reads a reply's calls."""
        self.end_of_turn = self._pick_end_of_turn(end_of_turn)
        """The token text that closes a model turn."""
        self.end_of_turn_id = self._token_id(self.end_of_turn)
        """The token that closes a model turn; appended (outside the loss) after a turn that stopped at another one."""
        for role in roles:
            self._check_role(role)
        self._check_keeps_thinking("user" if "user" in roles or not roles else roles[0])
        self.tools = [dict(schema) for schema in tools]
        """The tool schemas every prompt lists (none: prompts as the data module rendered them)."""
        question = [{"role": "user", "content": "?"}]
        with_tools = self._renders(question, self.tools) if self.tools else None
        self.template_renders_tools = with_tools is not None and with_tools != self._renders(question)
        """Whether the template writes the tools itself; if not, the instructions go into the prompt's messages."""
        self._system_instructions = self._renders([{"role": "system", "content": "?"}, *question]) is not None
        try:  # a template that cannot render a prompt fails here, not at the first episode
            self.prompt_ids(question)
        except EnvironmentFault as fault:
            raise ConfigError(f"{ENVIRONMENT_FLAG}: {fault.reason}; set {CHAT_TEMPLATE_FLAG}") from None

    @property
    def renders_prompts(self) -> bool:
        """Whether prompts are rendered here (:meth:`prompt_ids`), not as the data module did: tools to list, or a
        template or arguments other than the tokenizer's."""
        return bool(self.tools) or self.chat_template is not None or bool(self.template_kwargs)

    def _render(
        self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        kwargs = dict(self.template_kwargs)
        if tools:
            kwargs["tools"] = tools
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=generation_prompt, tokenize=False, **kwargs
            )
        )

    def _suffix(self, messages: Sequence[Mapping[str, Any]], end_of_turn: str) -> str:
        """The text after the probe's end-of-turn token once ``messages`` follow, both renderings made here.

        Raises:
            EnvironmentFault: If the template cannot render the messages, does not end the probe's turn with
                ``end_of_turn``, or renders that turn differently once the messages follow.
        """
        try:
            alone = self._render(_PROBE, generation_prompt=False)
            full = self._render([*_PROBE, *messages], generation_prompt=True)
        except Exception as err:  # jinja's TemplateError, raise_exception() inside the template, a missing variable
            roles = ", ".join(str(m.get("role")) for m in messages) or "generation prompt"
            raise EnvironmentFault(
                f"the chat template cannot render a {roles} message after an assistant turn: {one_line(err)}"
            ) from None
        start = alone.find(_SENTINEL)
        stop = alone.find(end_of_turn, start + len(_SENTINEL)) if start >= 0 else -1
        if stop < 0:
            raise EnvironmentFault(f"the chat template does not end an assistant turn with {end_of_turn!r}")
        prefix = alone[: stop + len(end_of_turn)]
        if not full.startswith(prefix):
            raise EnvironmentFault(
                "the chat template renders an assistant turn differently once a message follows it, so its tokens "
                "cannot be continued"
            )
        return full[len(prefix) :]

    def _pick_end_of_turn(self, given: str | None) -> str:
        try:
            alone = self._render(_PROBE, generation_prompt=False)
        except Exception as err:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template cannot render a user message and an assistant reply: "
                f"{one_line(err)}; set {CHAT_TEMPLATE_FLAG}"
            ) from None
        if _SENTINEL not in alone:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template does not write an assistant message's text (a template for "
                f"multimodal content lists?); set {CHAT_TEMPLATE_FLAG} to one that does"
            )
        eos = getattr(self.tokenizer, "eos_token", None)
        rest = alone[alone.find(_SENTINEL) + len(_SENTINEL) :]
        if not rest.strip():  # GLM-4's: the next turn's marker is the stop token
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template does not end an assistant turn with {eos!r} (the token the "
                f"model stops at), nor with anything else; set {CHAT_TEMPLATE_FLAG}"
            )
        after = token_at(rest, self.tokenizer.get_added_vocab())  # Gemma's <end_of_turn>
        candidates = [given] if given is not None else list(dict.fromkeys(t for t in (eos, after) if t))
        problems = []
        for candidate in candidates:
            try:
                self._suffix([], candidate)
                return str(candidate)
            except EnvironmentFault as fault:
                problems.append(fault.reason)
        if given is not None:
            raise ConfigError(f"{END_OF_TURN_FLAG}={given!r}: {problems[0]}")
        changed = [p for p in problems if "differently" in p]
        if changed:
            raise ConfigError(f"{ENVIRONMENT_FLAG}: {changed[0]}; {remedy(self.template)}")
        raise ConfigError(
            f"{ENVIRONMENT_FLAG}: the chat template does not end an assistant turn with {eos!r} (the token the model "
            f"stops at) nor with another special token; set {END_OF_TURN_FLAG}"
        )

    def _token_id(self, text: str) -> int:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            raise ConfigError(f"{END_OF_TURN_FLAG}: the end-of-turn text {text!r} is not one token: {ids}")
        return int(ids[0])

    def _check_role(self, role: str) -> None:
        message = {"role": role, "content": _MESSAGE, **({"name": "probe"} if role == "tool" else {})}
        try:
            suffix = self._suffix([message], self.end_of_turn)
        except EnvironmentFault as fault:
            hint = remedy(self.template) if "differently" in fault.reason else f"set {CHAT_TEMPLATE_FLAG}"
            raise ConfigError(f"{ENVIRONMENT_FLAG}: {fault.reason}; {hint}") from None
        if _MESSAGE not in suffix:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template drops a {role} message after an assistant turn (the model "
                f"would never read it); set {CHAT_TEMPLATE_FLAG}"
            )

    def _check_keeps_thinking(self, role: str) -> None:
        thought = {"role": "assistant", "content": f"<think>\n{_THOUGHT}\n</think>\n\n{_SENTINEL}"}
        try:
            text = self._render([_PROBE[0], thought, {"role": role, "content": "?"}], generation_prompt=True)
        except Exception:  # the roles were rendered above; a template that refuses this probe keeps nothing to drop
            return
        if _SENTINEL in text and _THOUGHT not in text:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG}: the chat template drops an earlier assistant turn's <think> block, so the "
                f"episode the model is trained on is not the conversation it sees; {remedy(self.template)}"
            )

    def _renders(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str | None:
        """The prompt's rendering, ``None`` when the template refuses it (refusing ``tools`` or a system message
        means the template has no place for them: the instructions go elsewhere)."""
        try:
            return self._render(messages, generation_prompt=True, tools=tools)
        except Exception:
            return None

    def suffix_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The text after a model turn's stop token: the messages in their turn markers, then the generation prompt.

        Raises:
            EnvironmentFault: If the template cannot render the messages, or renders the turns before them differently
                once they are there (the difference is then not a suffix): that episode is unscorable.
        """
        return self._suffix(messages, self.end_of_turn)

    def suffix_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids to append after a model turn that ended with its stop token: ``messages`` and the next
        generation prompt. An empty ``messages`` gives the markers of a new assistant turn alone.

        Raises:
            EnvironmentFault: As :meth:`suffix_text`.
        """
        return list(self.tokenizer(self.suffix_text(messages), add_special_tokens=False)["input_ids"])

    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A prompt's messages as the model sees them: with the call format's tool instructions in the system message
        when there are tools and the template does not write them itself (a system message is added when there is
        none; a template without system messages gets them at the start of the first user message)."""
        out = [dict(m) for m in messages]
        if not self.tools or self.template_renders_tools:
            return out
        instructions = self.call_format.instructions(self.tools)
        if self._system_instructions:
            if out and out[0].get("role") == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{instructions}"
            else:
                out.insert(0, {"role": "system", "content": instructions})
            return out
        users = [k for k, m in enumerate(out) if m.get("role") == "user"]
        if users:
            out[users[0]]["content"] = f"{instructions}\n\n{out[users[0]]['content']}"
        else:
            out.insert(0, {"role": "user", "content": instructions})
        return out

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """A prompt's token ids: the template with the generation prompt (and the tools, see
        :meth:`prompt_messages`), tokenised without added special tokens (as
        :func:`lit_fgrpo.data.records.render_records` tokenises templated prompts).

        Raises:
            EnvironmentFault: If the template cannot render the prompt (its episode is unscorable).
        """
        tools = self.tools if self.template_renders_tools else None
        try:
            text = self._render(self.prompt_messages(messages), generation_prompt=True, tools=tools)
        except Exception as err:
            raise EnvironmentFault(f"the chat template cannot render the prompt: {one_line(err)}") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """A model turn's text for the environment to read (special tokens dropped); its ids stay as sampled."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
