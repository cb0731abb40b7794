"""What a model turn asks of its environment: the tool calls to run, ``step``, or the end; and the messages it gets.

:func:`plan_reaction` reads a reply (parsing is guarded: whatever the model wrote, a call that cannot be parsed is a
``malformed`` call the model reads, never an exception) and returns a :class:`Reaction`: the calls for the episode's
worker and, once their outcomes are in, :meth:`Reaction.messages` puts the conversation's next messages together in
the order the model wrote its calls, calls that could not run answered by their error message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_fgrpo.environments.base import EnvironmentSet
from lit_fgrpo.environments.episode import Episode, Role
from lit_fgrpo.environments.host import Call, Outcome
from lit_fgrpo.environments.tools import ToolCall, ToolCallError, error_message
from lit_fgrpo.environments.turns import ChatTurns

ReactionKind = Literal["tools", "step", "end"]


@dataclass
class Reaction:
    """The environment's part after one model turn."""

    kind: ReactionKind
    """``tools`` (the reply called tools), ``step`` (a text environment reads it) or ``end`` (neither: done)."""
    cut: bool
    """The model turn was cut before its stop token."""
    calls: list[Call] = field(default_factory=list)
    """The worker's request (the runnable tool calls, or ``step``)."""
    plan: list[tuple[str, str | None]] = field(default_factory=list)
    """Per call the model wrote, in order: (tool name, the error message when it could not run, else ``None``)."""
    invalid: list[str] = field(default_factory=list)
    """The kinds of the calls that could not run (``malformed``, ``unknown_tool``, ``bad_arguments``)."""

    @property
    def role(self) -> Role:
        return "tool" if self.kind == "tools" else "user"

    @property
    def done_reason(self) -> str:
        return "done" if self.kind == "step" else "no tool call"

    def messages(self, outcomes: Sequence[Outcome], episode: Episode) -> tuple[list[dict[str, str]], bool]:
        """The messages the model reads next and whether the episode is done; counts the calls on ``episode``."""
        if self.kind == "end":
            return [], True
        if self.kind == "step":
            observation, done = outcomes[0][1]
            return ([] if observation is None else [{"role": "user", "content": observation}]), bool(done)
        answers = iter(outcomes)
        messages = []
        for name, error in self.plan:
            if error is None:
                outcome = next(answers)
                text = str(outcome[1])
                if outcome[0] == "tool_error":
                    episode.invalid_calls[outcome[2]] += 1
                    episode.tool_errors[name] += 1
                else:
                    episode.tool_calls[name] += 1
            else:
                text = error
            messages.append({"role": "tool", "name": name, "content": text})
        return messages, False


def plan_reaction(
    reply: str,
    turns: ChatTurns,
    schemas: Sequence[Mapping[str, Any]],
    environments: EnvironmentSet,
    environment: str,
    cut: bool,
) -> Reaction:
    """What the environment does with ``reply``: run its tool calls, else ``step`` it (a text environment), else end.

    Args:
        reply: The model turn's text (decoded for reading; its tokens stay as sampled).
        turns: The episode's chat turns (their ``call_format`` parses the calls).
        schemas: The tools the episode lists.
        environments: The run's environments (which tools are standalone).
        environment: The episode's environment name.
        cut: The turn was cut before its stop token.
    """
    parsed = _parse(reply, turns, schemas) if schemas else []
    spec = environments.spec(environment)
    own = set(spec.tools) if spec is not None else set()
    if parsed:
        reaction = Reaction("tools", cut)
        for call in parsed:
            if isinstance(call, ToolCallError):
                reaction.invalid.append(call.kind)
                reaction.plan.append((call.name or "error", error_message(call, schemas)))
            else:
                standalone = call.name not in own
                reaction.calls.append(
                    Call("tool", environment, call.name, kwargs=call.arguments, standalone=standalone)
                )
                reaction.plan.append((call.name, None))
        return reaction
    if spec is not None and spec.has_step:
        return Reaction("step", cut, [Call("step", environment, "step", args=(reply,))])
    return Reaction("end", cut)


def _parse(reply: str, turns: ChatTurns, schemas: Sequence[Mapping[str, Any]]) -> list[ToolCall | ToolCallError]:
    try:
        return list(turns.call_format.parse(reply, schemas))
    except Exception as err:  # the parsers are guarded; this is the last line: model output never ends the run
        return [ToolCallError("malformed", f"the call could not be read ({type(err).__name__})")]
