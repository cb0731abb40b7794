"""The batched multi-turn driver: all live episodes advance together, one ``generate`` call per turn.

Engine-agnostic: the driver is given a ``generate(prompts, max_new_tokens, seeds)`` callable (:data:`Generate`) that
samples one continuation per row and returns, per row, the token ids, their sampling log-probs (or ``None``) and
whether the row ended at a stop token. Each turn:

1. every live episode with room left (:meth:`Episode.room`) sends its whole token sequence, its own token cap and
   the seed :func:`~lit_fgrpo.environments.episode.turn_seed` of (episode seed, turn index): what an episode samples
   depends on its own seed and turn only, never on the batch layout;
2. the model turn is appended exactly as sampled (a row longer than its cap is cut there and counts as not finished);
3. the environment reacts to the decoded reply: tool calls run (:mod:`~lit_fgrpo.environments.tools`), else ``step``,
   else (no ``step``) the episode is done. A fault makes the episode unscorable (:mod:`~lit_fgrpo.environments.faults`);
4. the reaction is appended as environment tokens (:class:`~lit_fgrpo.environments.turns.ChatTurns`), unless the
   episode is done or a limit stops it (then it is truncated).

An ended episode's ``get_reward`` is asked once. :func:`episode_stats` sums up what a researcher sees per step.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_fgrpo.environments.base import ENVIRONMENT_FLAG, EnvironmentFactory
from lit_fgrpo.environments.episode import Episode, EpisodeLimits, Role, turn_seed
from lit_fgrpo.environments.faults import (
    EnvironmentFault,
    checked_observation,
    checked_reward,
    checked_step,
    guarded_call,
)
from lit_fgrpo.environments.tools import ToolCallError, error_message, parse_tool_calls, run_tool
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError

Generate = Callable[[list[list[int]], list[int], list[int]], Sequence[tuple[list[int], list[float] | None, bool]]]
"""``generate(prompt_token_lists, max_new_tokens_per_row, seeds) -> [(token_ids, logprobs | None, finished), ...]``:
one sampled continuation per row; ``finished`` is True when the row ended at a stop token (which it includes).

Over a :class:`~lit_fgrpo.engines.base.RolloutEngine` it is ``engine.generate(prompts, replace(sampling, n=1,
max_tokens=M), seeds)`` with ``M`` the same on every call and rank (``max_turn_tokens``, else ``max_episode_tokens``: an
engine shared by the ranks refuses a round whose settings differ); the driver cuts each row at its own cap."""


@dataclass(frozen=True)
class EpisodeStart:
    """What one episode starts from."""

    prompt_ids: list[int]
    """The prompt's token ids (the data module's rendering)."""
    seed: int
    """The episode's seed (:func:`~lit_fgrpo.environments.episode.sample_seed` of its prompt's seed and index)."""
    row: Mapping[str, Any] = field(default_factory=dict)
    """The dataset row ``reset(**row)`` receives (``prompt`` and the columns, e.g. ``answer``)."""
    messages: list[dict[str, str]] | None = None
    """The prompt as chat messages: the conversation's start, and what a ``reset`` observation is appended to."""


class EpisodeDriver:
    """Runs episodes of one environment class.

    Args:
        factory: The checked environment class (:func:`~lit_fgrpo.environments.base.load_environment`).
        turns: The chat template's turn markers for the policy's tokenizer.
        limits: Turns, tokens per episode, tokens per turn, context.
        call_timeout: Seconds one ``reset`` / ``step`` / tool / ``get_reward`` call may take (``None``: no limit).
    """

    def __init__(
        self, factory: EnvironmentFactory, turns: ChatTurns, limits: EpisodeLimits, call_timeout: float | None = None
    ) -> None:
        if call_timeout is not None and not call_timeout > 0:
            raise ConfigError(f"--rollout.environment_timeout must be > 0 seconds or null, got {call_timeout}")
        self.factory = factory
        self.turns = turns
        self.limits = limits
        self.call_timeout = call_timeout
        self.schemas = factory.tool_schemas()
        self.seconds: dict[str, float] = dict.fromkeys(("generate", "environment", "driver"), 0.0)
        """Wall-clock seconds of the last :meth:`run`: ``generate``, ``environment`` (its calls) and ``driver``."""

    def start(self, starts: Sequence[EpisodeStart]) -> list[Episode]:
        """Make each episode's environment and ``reset`` it; a fault leaves that episode ended and unscorable."""
        episodes = []
        for spec in starts:
            episode = Episode(list(spec.prompt_ids), int(spec.seed), messages=[dict(m) for m in spec.messages or []])
            episodes.append(episode)
            try:
                episode.environment = self._call(self.factory, "the environment's constructor")
                reset = functools.partial(episode.environment.reset, **spec.row)
                observation = checked_observation(self._call(reset, "reset"), "reset")
            except EnvironmentFault as fault:
                episode.end("fault", unscorable=fault.reason)
                continue
            if observation is not None:
                self._append_to_prompt(episode, spec, observation)
            if episode.room(self.limits) < 1:
                self._finish(episode, "prompt fills the context", truncated=True)
        return episodes

    def _append_to_prompt(self, episode: Episode, spec: EpisodeStart, observation: str) -> None:
        """TRL's rule: ``reset``'s text is appended to the last user message, and the prompt rendered again."""
        users = [i for i, m in enumerate(spec.messages or []) if m.get("role") == "user"]
        if not users:
            raise ConfigError(
                f"{ENVIRONMENT_FLAG} {self.factory.name}.reset returned an observation, but the prompt came without "
                "a user message to append it to"
            )
        messages = [dict(m) for m in spec.messages or []]
        last = users[-1]
        messages[last]["content"] = messages[last]["content"] + observation
        episode.messages = messages
        episode.prompt_ids = self.turns.prompt_ids(messages)

    def advance(self, episodes: Sequence[Episode], generate: Generate) -> int:
        """One turn of every live episode: one ``generate`` call, then each environment's reaction.

        Returns:
            How many episodes took part (0 when none was live).
        """
        live = [e for e in episodes if e.live]
        rooms = [e.room(self.limits) for e in live]
        for episode, room in zip(live, rooms):
            if room < 1:
                self._finish(episode, "token budget", truncated=True)
        live, rooms = [e for e, r in zip(live, rooms) if r >= 1], [r for r in rooms if r >= 1]
        if not live:
            return 0
        start = time.perf_counter()
        outputs = generate([e.token_ids() for e in live], rooms, [turn_seed(e.seed, e.turns) for e in live])
        self.seconds["generate"] += time.perf_counter() - start
        if len(outputs) != len(live):
            raise ValueError(f"generate returned {len(outputs)} rows for {len(live)} episodes")
        for episode, room, (ids, logprobs, finished) in zip(live, rooms, outputs):
            ids, logprobs = list(ids), None if logprobs is None else list(logprobs)
            if len(ids) > room:  # the engine sampled past this row's cap: its first `room` tokens are the sample
                ids, logprobs, finished = ids[:room], None if logprobs is None else logprobs[:room], False
            episode.add_model_turn(ids, logprobs, self.turns.decode(ids))
            self._react(episode, episode.messages[-1]["content"], cut=not finished)
        return len(live)

    def run(
        self, starts: Sequence[EpisodeStart], generate: Generate, join: Callable[[], None] | None = None
    ) -> list[Episode]:
        """Start the episodes and advance them until every one has ended (at most ``max_turns`` generate calls).

        Args:
            starts: One per episode.
            generate: The engine's sampling, one call per turn.
            join: Called once for each of the ``max_turns`` rounds the episodes did not need. An engine shared by
                the ranks (``RankedEngine``) samples in collective rounds: with ``join=lambda:
                engine.join_round(sampling)`` every rank takes part in exactly ``max_turns`` rounds, however soon its
                own episodes end.
        """
        self.seconds = dict.fromkeys(("generate", "environment", "driver"), 0.0)
        began = time.perf_counter()
        episodes = self.start(starts)
        rounds = 0
        while self.advance(episodes, generate):
            rounds += 1
        if join is not None:
            for _ in range(self.limits.max_turns - rounds):
                join()
        self.seconds["driver"] = time.perf_counter() - began - self.seconds["generate"] - self.seconds["environment"]
        return episodes

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        start = time.perf_counter()
        try:
            return guarded_call(fn, what, self.call_timeout)
        finally:
            self.seconds["environment"] += time.perf_counter() - start

    def _react(self, episode: Episode, reply: str, cut: bool) -> None:
        """The environment's answer to a model turn, appended as tokens unless the episode ends here."""
        environment = episode.environment
        role: Role = "user"
        try:
            calls = parse_tool_calls(reply, self.schemas) if self.schemas else []
            if calls:
                messages, done, role = self._run_calls(episode, calls), False, "tool"
            elif self.factory.has_step:
                observation, done = checked_step(self._call(lambda: environment.step(reply), "step"))
                messages = [] if observation is None else [{"role": "user", "content": observation}]
            else:
                messages, done = [], True
        except EnvironmentFault as fault:
            self._finish(episode, "fault", unscorable=fault.reason)
            return
        if done:
            episode.messages += [{"role": m["role"], "content": m["content"]} for m in messages]
            self._finish(episode, "done" if self.factory.has_step else "no tool call", truncated=cut)
            return
        if cut:
            self._finish(episode, "turn cut at max tokens", truncated=True)
            return
        if episode.turns >= self.limits.max_turns:
            self._finish(episode, "max_turns", truncated=True)
            return
        ids = self.turns.suffix_ids(messages)
        if episode.segments[-1].ids[-1:] != [self.turns.end_of_turn_id]:  # stopped at another stop token
            ids = [self.turns.end_of_turn_id, *ids]
        if len(ids) + 1 > episode.tokens_left(self.limits):  # no room for the reply and one more model token
            self._finish(episode, "token budget", truncated=True)
            return
        episode.messages += [{"role": m["role"], "content": m["content"]} for m in messages]
        episode.add_environment_turn(ids, role)

    def _run_calls(self, episode: Episode, calls: Sequence[Any]) -> list[dict[str, str]]:
        """Run a reply's tool calls in order; one tool message each (an error message for a call that cannot run)."""
        messages = []
        for call in calls:
            if isinstance(call, ToolCallError):
                episode.invalid_calls[call.kind] += 1
                name, text = call.name or "error", error_message(call, self.schemas)
            else:
                start = time.perf_counter()
                try:
                    text, error = run_tool(getattr(episode.environment, call.name), call, self.call_timeout)
                finally:
                    self.seconds["environment"] += time.perf_counter() - start
                name = call.name
                if error is not None:
                    episode.invalid_calls[error.kind] += 1
                else:
                    episode.tool_calls[call.name] += 1
            messages.append({"role": "tool", "name": name, "content": text})
        return messages

    def _finish(self, episode: Episode, reason: str, truncated: bool = False, unscorable: str | None = None) -> None:
        """End an episode; a scorable one's environment is asked for its reward (a fault there: unscorable)."""
        if unscorable is None and self.factory.has_reward and episode.environment is not None:
            environment = episode.environment
            try:
                episode.reward = checked_reward(self._call(environment.get_reward, "get_reward"))
            except EnvironmentFault as fault:
                unscorable = fault.reason
        episode.end(reason, truncated=truncated, unscorable=unscorable)


def episode_stats(episodes: Sequence[Episode], tools: Sequence[str] = ()) -> dict[str, float]:
    """What a researcher sees per step (logged under ``rollout/``).

    ``turns_per_episode`` (mean), ``tool_calls_valid`` and ``tool_calls_invalid`` (totals, the invalid ones also by
    kind: ``tool_calls_malformed``, ``tool_calls_unknown_tool``, ``tool_calls_bad_arguments``, ``tool_calls_tool_error``),
    ``tool_calls/<tool>`` for every tool (0 when never called: a run that "succeeds" without its tool shows it),
    ``episodes_truncated`` and ``environment_errors`` (counts), ``environment_tokens`` (mean environment tokens per
    episode).
    """
    count = max(len(episodes), 1)
    valid: Counter[str] = Counter({name: 0 for name in tools})
    invalid: Counter[str] = Counter({kind: 0 for kind in ("malformed", "unknown_tool", "bad_arguments", "tool_error")})
    for episode in episodes:
        valid.update(episode.tool_calls)
        invalid.update(episode.invalid_calls)
    stats = {
        "turns_per_episode": sum(e.turns for e in episodes) / count,
        "tool_calls_valid": float(sum(valid.values())),
        "tool_calls_invalid": float(sum(invalid.values())),
        "episodes_truncated": float(sum(e.truncated for e in episodes)),
        "environment_errors": float(sum(e.unscorable is not None for e in episodes)),
        "environment_tokens": sum(len(s.ids) for e in episodes for s in e.segments if not s.trained) / count,
    }
    stats |= {f"tool_calls_{kind}": float(n) for kind, n in invalid.items()}
    stats |= {f"tool_calls/{name}": float(n) for name, n in sorted(valid.items())}
    return stats
