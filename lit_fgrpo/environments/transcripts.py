"""A chat transcript as the tokens of an episode: the supervised warm start trains on exactly what RL trains on.

An episode's row is (:mod:`~lit_fgrpo.environments.episode`)::

    prompt_ids(prompt) | assistant 1 <eot> | suffix_ids(tool/user messages) | assistant 2 <eot> | ...
    loss mask               1 ... 1               0 ... 0                       1 ... 1

:func:`render_transcript` builds the same row from a conversation's ``messages``: the messages before the first
assistant reply are the prompt (:meth:`ChatTurns.prompt_ids`: the tools listed as the episodes list them), each
assistant message is its content's tokens and the end-of-turn token (what the model samples), and the messages
between two assistant replies are :meth:`ChatTurns.suffix_ids` (the environment's turn, with the next generation
prompt). Messages after the last assistant reply carry no tokens (an episode's last environment answer is never
tokenised either).

A transcript that no episode could produce is refused with a :class:`TranscriptError` (its ``kind`` counts skips):
a role other than system, user, assistant and tool, or one the chat template cannot render (``"role"``); a tool call
that does not parse or fit its tool's schema (``"tool_call"``); tool messages that do not answer the reply's calls
one for one, or a prompt without a user turn (``"layout"``); more tokens than the context (``"too_long"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lit_fgrpo.environments.tools import ToolCallError
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError

TranscriptProblem = Literal["role", "tool_call", "layout", "too_long"]
"""Why a transcript cannot be rendered (the key of a counted skip)."""

ROLES = ("system", "user", "assistant", "tool")
"""The roles a transcript may hold (an episode's prompt, the model, and what the environment says)."""


class TranscriptError(ValueError):
    """A transcript that no episode could produce: one line (without the file and row, which the reader adds)."""

    def __init__(self, kind: TranscriptProblem, message: str) -> None:
        super().__init__(message)
        self.kind: TranscriptProblem = kind


@dataclass(frozen=True)
class TranscriptTokens:
    """One transcript as one training row (T = tokens after the prompt)."""

    prompt_ids: list[int]
    """The prompt as an episode starts from it (tools listed, generation prompt)."""
    completion_ids: list[int]
    """(T,) assistant and environment tokens in order, as an episode lays them out."""
    loss_mask: list[int]
    """(T,) 1 on the assistant's tokens (their end-of-turn token included), 0 on every environment token."""

    @property
    def ids(self) -> list[int]:
        """The whole row: prompt then completion."""
        return self.prompt_ids + self.completion_ids

    @property
    def trained_tokens(self) -> int:
        """How many tokens carry the loss."""
        return sum(self.loss_mask)


def checked_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as plain dicts (keys with ``None`` values dropped: Parquet fills absent struct fields with them).

    Raises:
        TranscriptError: If ``messages`` is not a non-empty list of objects with a known string ``role`` and string
            ``content``, or an assistant message carries structured ``tool_calls`` instead of Hermes text.
    """
    if not isinstance(messages, list) or not messages:
        raise TranscriptError("layout", f"'messages' must be a non-empty list, got {type(messages).__name__}")
    out = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping):
            raise TranscriptError("layout", f"message {number} is a {type(message).__name__}, not an object")
        message = {key: value for key, value in message.items() if value is not None}
        role = message.get("role")
        if role not in ROLES:
            raise TranscriptError("role", f"message {number} has role {role!r}; the roles are {', '.join(ROLES)}")
        if message.get("tool_calls"):
            raise TranscriptError(
                "tool_call",
                f"message {number} has structured 'tool_calls'; write each call as "
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call> text in its content',
            )
        if not isinstance(message.get("content"), str):
            raise TranscriptError("layout", f"message {number} ({role}) has no string 'content'")
        out.append(message)
    return out


def _assistant_ids(turns: ChatTurns, content: str, number: int) -> list[int]:
    """What the model samples for a reply: its text's tokens, then the end-of-turn token."""
    if turns.end_of_turn in content:
        raise TranscriptError(
            "layout", f"message {number} (assistant) contains the end-of-turn text {turns.end_of_turn!r}"
        )
    return [*turns.tokenizer(content, add_special_tokens=False)["input_ids"], turns.end_of_turn_id]


def read_calls(turns: ChatTurns, content: str) -> list[Any]:
    """A reply's tool calls as the episodes read them: the turns' call format (Hermes by default)."""
    call_format = getattr(turns, "call_format", None)
    if call_format is not None:
        return list(call_format.parse(content, turns.tools))
    from lit_fgrpo.environments import parse_tool_calls  # the Hermes reader, where the turns name no format

    return list(parse_tool_calls(content, turns.tools))


def _call_names(turns: ChatTurns, content: str, number: int) -> list[str]:
    """The tools a reply calls (none without tools: the driver reads no calls then), each call checked."""
    names = []
    for call in read_calls(turns, content) if turns.tools else []:
        if isinstance(call, ToolCallError):
            raise TranscriptError(
                "tool_call", f"message {number} (assistant): a tool call does not parse: {call.detail}"
            )
        names.append(call.name)
    return names


def _environment_turn(block: list[dict[str, Any]], calls: list[str], number: int) -> list[dict[str, Any]]:
    """The messages between two replies, checked against the reply's calls (tool names filled in where missing)."""
    roles = [m["role"] for m in block]
    if "system" in roles:
        raise TranscriptError(
            "layout", f"message {number + 1 + roles.index('system')} is a system message after a reply"
        )
    if calls and roles != ["tool"] * len(calls):
        raise TranscriptError(
            "layout",
            f"message {number} (assistant) makes {len(calls)} tool call(s), answered by {roles.count('tool')} tool "
            f"message(s) of the {len(block)} after it (the environment answers each call with one tool message)",
        )
    if not calls and "tool" in roles:
        raise TranscriptError(
            "layout", f"message {number + 1 + roles.index('tool')} is a tool message answering no call"
        )
    return [{**m, "name": m.get("name", name)} if m["role"] == "tool" else m for m, name in zip(block, calls or roles)]


def _render(turns: ChatTurns, what: str, render: Any, *args: Any) -> list[int]:
    """``render(*args)``; a template that refuses the messages (ChatTurns' ConfigError, which names the environment
    setting, or jinja's own error) is the transcript's fault here."""
    try:
        return list(render(*args))
    except (ConfigError, Exception) as err:
        raise TranscriptError("role", f"the chat template cannot render the {what}: {err}") from None


def render_transcript(
    turns: ChatTurns, messages: Sequence[Mapping[str, Any]], max_length: int | None = None
) -> TranscriptTokens:
    """A conversation's tokens and loss mask, laid out as an episode of the same conversation.

    Args:
        turns: The chat turns the episodes use (same tokenizer and tool schemas).
        messages: ``{role, content}`` messages; tool calls as Hermes ``<tool_call>{...}</tool_call>`` text inside the
            assistant's content, each answered by one ``tool`` message.
        max_length: The context (prompt and completion tokens together); ``None``: no limit.

    Raises:
        TranscriptError: If no episode could produce the conversation (see the module docstring).
    """
    checked = checked_messages(list(messages))
    replies = [i for i, m in enumerate(checked) if m["role"] == "assistant"]
    if not replies:
        raise TranscriptError("layout", "no assistant message: nothing to train on")
    prompt = checked[: replies[0]]
    if not any(m["role"] == "user" for m in prompt):
        raise TranscriptError("layout", "no user message before the first assistant message")
    if any(m["role"] == "tool" for m in prompt):
        raise TranscriptError("layout", "a tool message before the first assistant message")
    prompt_ids = _render(turns, "prompt", turns.prompt_ids, prompt)
    completion: list[int] = []
    mask: list[int] = []
    for k, i in enumerate(replies):
        ids = _assistant_ids(turns, checked[i]["content"], i + 1)
        completion += ids
        mask += [1] * len(ids)
        calls = _call_names(turns, checked[i]["content"], i + 1)
        if k + 1 < len(replies):
            block = _environment_turn(checked[i + 1 : replies[k + 1]], calls, i + 1)
            ids = _render(turns, f"messages after message {i + 1}", turns.suffix_ids, block)
            completion += ids
            mask += [0] * len(ids)
    length = len(prompt_ids) + len(completion)
    if max_length is not None and length > max_length:
        raise TranscriptError("too_long", f"{length} tokens, longer than the context ({max_length})")
    return TranscriptTokens(prompt_ids, completion, mask)


__all__ = ["ROLES", "TranscriptError", "TranscriptProblem", "TranscriptTokens", "checked_messages", "render_transcript"]
