"""One multi-turn episode as tokens: the prompt, then model and environment segments, and the training row it makes.

Model segments hold the token ids and sampling log-probs exactly as the engine returned them (never decoded and
encoded again); environment segments hold the tokens of environment and tool messages in the chat template's turn
markers (:class:`~lit_fgrpo.environments.turns.ChatTurns`). The whole episode is one training row
(:func:`training_row`):

    prompt | model turn 1 | env | model turn 2 | env | model turn 3
    loss mask  1 ... 1      0..0   1 ... 1       0..0   1 ... 1

so the loss and the KL see only the model's tokens, and the sampling log-probs line up with them (0 elsewhere).

Limits (:class:`EpisodeLimits`): ``max_turns`` model turns, ``max_episode_tokens`` tokens after the prompt (model and
environment together: the row's width), and the model's context (prompt included). An episode that reaches one
ends and is marked truncated; so is one whose model turn was cut before its stop token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from lit_fgrpo.distributed.rank_layout import prompt_seed
from lit_fgrpo.errors import ConfigError

Role = Literal["assistant", "user", "tool"]

_SAMPLE_STREAM = 0x5A
_TURN_STREAM = 0x7E


def sample_seed(group_seed: int, sample: int) -> int:
    """Episode ``sample`` of a prompt whose sampling seed is ``group_seed`` (``prompt_seed`` of the collector).

    Mixed by the chained SplitMix64 of :func:`~lit_fgrpo.distributed.rank_layout.prompt_seed`, so it depends on the
    prompt's seed and the sample's index only, never on which rank or batch row holds the episode.
    """
    return prompt_seed(group_seed, sample, 0, _SAMPLE_STREAM)


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of model turn ``turn`` (0-based) of an episode: its own seed and the turn index only."""
    return prompt_seed(episode_seed, turn, 0, _TURN_STREAM)


@dataclass(frozen=True)
class EpisodeLimits:
    """How far one episode may run; reaching a limit ends it, marked truncated."""

    max_turns: int = 4
    """Model turns per episode."""
    max_episode_tokens: int = 256
    """Tokens after the prompt, model and environment tokens together (the training row's completion width)."""
    max_turn_tokens: int | None = None
    """Tokens one model turn may sample (``None``: what is left of the episode's budget)."""
    max_context: int | None = None
    """The model's context length: prompt and completion together (``None``: no limit beyond the budget)."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_episode_tokens", "max_turn_tokens", "max_context"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--rollout.{name} must be >= 1, got {value}")


@dataclass
class Segment:
    """A run of tokens from one side of the conversation."""

    role: Role
    """``assistant`` for the model's tokens, ``user`` or ``tool`` for the environment's."""
    ids: list[int]
    """Token ids: as sampled (model), or the template's rendering of the messages (environment)."""
    logprobs: list[float] | None = None
    """The engine's sampling log-prob of each id (model segments, when the engine reports them)."""

    @property
    def trained(self) -> bool:
        """Whether these tokens carry the loss: the model's, never the environment's."""
        return self.role == "assistant"


@dataclass
class Episode:
    """The state of one episode: its environment, its tokens so far, and how it ended."""

    prompt_ids: list[int]
    """The prompt (with a ``reset`` observation appended, when there was one)."""
    seed: int
    """The episode's own seed (:func:`sample_seed`); turn ``k`` samples with :func:`turn_seed` of it."""
    environment_name: str = ""
    """The episode's environment (its name in ``--rollout.environment``; ``""`` for the one environment)."""
    segments: list[Segment] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    """The conversation as ``{role, content}`` messages, prompt messages first when they were given."""
    turns: int = 0
    """Model turns so far."""
    ended: bool = False
    truncated: bool = False
    """A limit ended the episode, or its last model turn was cut before its stop token."""
    end_reason: str = ""
    """Why it ended: ``"done"``, ``"no tool call"``, ``"max_turns"``, ``"turn cut at max tokens"``, ... or the fault."""
    unscorable: str | None = None
    """The environment fault that ended the episode (:mod:`~lit_fgrpo.environments.faults`); ``None`` when healthy."""
    reward: float | None = None
    """The environment's ``get_reward()``, when it has one and the episode is scorable."""
    tool_calls: Counter[str] = field(default_factory=Counter)
    """Tool name -> calls that ran."""
    invalid_calls: Counter[str] = field(default_factory=Counter)
    """Kind (``malformed``, ``unknown_tool``, ``bad_arguments``, ``tool_error``, ``tool_exception``) -> calls answered
    with an error."""
    tool_errors: Counter[str] = field(default_factory=Counter)
    """Tool name -> calls that raised (``ToolError`` or another exception), answered with the error."""
    fault_kind: str | None = None
    """Which call made the episode unscorable (``reset``, ``step``, ``get_reward``, ``constructor``, ``timeout``,
    ``template``, ``worker``, ``routing``); ``None`` when healthy."""
    prompt_messages: list[dict[str, str]] | None = None
    """The prompt's messages as the episode started from them (``None``: a left-truncated prompt)."""
    finish_reason: tuple[str, bool] | None = None
    """Set when the episode is to end (reason, truncated): its ``get_reward`` is asked before it does."""

    @property
    def live(self) -> bool:
        return not self.ended

    @property
    def completion_ids(self) -> list[int]:
        """Every token after the prompt, model and environment alike."""
        return [token for segment in self.segments for token in segment.ids]

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(segment.ids) for segment in self.segments)

    def token_ids(self) -> list[int]:
        """The whole sequence so far: the next model turn continues exactly these ids."""
        return self.prompt_ids + self.completion_ids

    def tokens_left(self, limits: EpisodeLimits) -> int:
        """How many more tokens, model or environment, fit the episode's budget and the model's context."""
        left = limits.max_episode_tokens - self.num_completion_tokens
        if limits.max_context is not None:
            left = min(left, limits.max_context - len(self.prompt_ids) - self.num_completion_tokens)
        return left

    def room(self, limits: EpisodeLimits) -> int:
        """How many tokens the next model turn may sample: :meth:`tokens_left`, and at most ``max_turn_tokens``."""
        left = self.tokens_left(limits)
        return left if limits.max_turn_tokens is None else min(left, limits.max_turn_tokens)

    def add_model_turn(self, ids: list[int], logprobs: list[float] | None, text: str) -> None:
        """Append a model turn as sampled (ids and log-probs untouched) and its decoded text to the conversation."""
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"a model turn has {len(ids)} tokens but {len(logprobs)} log-probs")
        self.segments.append(Segment("assistant", list(ids), None if logprobs is None else list(logprobs)))
        self.messages.append({"role": "assistant", "content": text})
        self.turns += 1

    def add_environment_turn(self, ids: list[int], role: Role) -> None:
        """Append the environment's tokens (its messages, already in the conversation, plus the turn markers)."""
        self.segments.append(Segment(role, list(ids)))

    def end(self, reason: str, truncated: bool = False, unscorable: str | None = None) -> None:
        """End the episode (idempotent: the first reason stays, a fault is recorded whenever it comes)."""
        if unscorable is not None:
            self.unscorable = unscorable
        if not self.ended:
            self.ended, self.end_reason = True, unscorable or reason
        self.truncated = self.truncated or truncated


@dataclass
class TrainingRow:
    """One episode as one training row (T = tokens after the prompt)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    """(T,) every token after the prompt: model and environment segments in order."""
    loss_mask: list[int]
    """(T,) 1 on the model's tokens, 0 on every environment and tool token; all 0 for an unscorable episode, and for a
    truncated one under ``mask_truncated``."""
    sampling_logprobs: list[float] | None
    """(T,) the engine's log-probs on the model's tokens, 0.0 on the environment's; ``None`` if the engine gave none."""
    messages: list[dict[str, str]]
    """The conversation, ``{role, content}`` per message (the sample table's view)."""
    truncated: bool
    unscorable: str | None
    reward: float | None
    """The environment's reward (``get_reward``); ``None`` when it has none or the episode is unscorable."""
    turns: int


def training_row(episode: Episode, mask_truncated: bool = False) -> TrainingRow:
    """The training row of an ended episode: completion ids, loss mask and aligned sampling log-probs.

    Args:
        episode: An episode (normally ended).
        mask_truncated: No loss on a truncated episode (DAPO's overlong filtering, as single-turn rows get it).
    """
    ids: list[int] = []
    mask: list[int] = []
    has_logprobs = all(s.logprobs is not None for s in episode.segments if s.trained)
    logprobs: list[float] | None = [] if has_logprobs else None
    silenced = episode.unscorable is not None or (mask_truncated and episode.truncated)
    for segment in episode.segments:
        ids += segment.ids
        mask += [int(segment.trained and not silenced)] * len(segment.ids)
        if logprobs is not None:
            logprobs += segment.logprobs if segment.logprobs is not None else [0.0] * len(segment.ids)
    return TrainingRow(
        prompt_ids=list(episode.prompt_ids),
        completion_ids=ids,
        loss_mask=mask,
        sampling_logprobs=logprobs,
        messages=[dict(m) for m in episode.messages],
        truncated=episode.truncated,
        unscorable=episode.unscorable,
        reward=episode.reward,
        turns=episode.turns,
    )
