"""The multi-turn driver: episodes advance on their own, each turn sampled as soon as its environment has answered.

Engine-agnostic: the driver is given a ``generate(prompts, max_new_tokens, seeds)`` callable (:data:`Generate`) that
samples one continuation per row and returns, per row, the token ids, their sampling log-probs (or ``None``) and
whether the row ended at a stop token. Each episode is bound to one worker (:mod:`~lit_fgrpo.environments.workers`)
for all of its environment calls; the driver loop is

1. send every request that is due (``reset``; a reply's tool calls or ``step``; ``get_reward``) to the episode's
   worker, without waiting;
2. take the answers that are in. An episode whose environment has answered is *ready*; the others go on working;
3. sample the next turn of every ready episode in one ``generate`` call, while the environments of the others run.
   Each row samples with :func:`~lit_fgrpo.environments.episode.turn_seed` of (episode seed, turn index): what an
   episode samples depends on its own seed and turn only, never on which episodes share a call, so the result is the
   same as in lockstep and on any rank layout.

Before sampling, the driver lets the answers that are coming in arrive (until none came for :data:`GATHER_S`, at most
:data:`GATHER_MAX_S`), so that quick environments join the same ``generate`` call (a batch of one row at a time would
waste the engine), while a slow one holds up nobody but its own episode. With an engine the ranks share
(collective rounds) it runs in ``lockstep`` instead: each round waits for every environment, so every rank makes
the same ``max_turns`` rounds.

Nothing an episode produces can end the run: a reply that does not parse is a malformed call the model reads; a tool
that raises is an error message the model reads (counted per tool); a fault of the constructor, ``reset``, ``step``,
``get_reward``, the chat template or a time limit makes that episode unscorable (counted by kind).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_fgrpo.environments.base import EnvironmentSet, EnvironmentSpec
from lit_fgrpo.environments.episode import Episode, EpisodeLimits, turn_seed
from lit_fgrpo.environments.faults import EnvironmentFault
from lit_fgrpo.environments.host import Call
from lit_fgrpo.environments.reaction import Reaction, plan_reaction
from lit_fgrpo.environments.turn_budget import fit_messages
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.environments.workers import Isolation, Worker, WorkerPool
from lit_fgrpo.errors import ConfigError

Generate = Callable[[list[list[int]], list[int], list[int]], Sequence[tuple[list[int], list[float] | None, bool]]]
"""``generate(prompt_token_lists, max_new_tokens_per_row, seeds) -> [(token_ids, logprobs | None, finished), ...]``:
one sampled continuation per row; ``finished`` is True when the row ended at a stop token (which it includes).

Over a :class:`~lit_fgrpo.engines.base.RolloutEngine` it is ``engine.generate(prompts, replace(sampling, n=1,
max_tokens=M), seeds)`` with ``M`` the same on every call and rank; the driver cuts each row at its own cap."""

GATHER_S = 0.1
"""Seconds without a new answer after which the ready episodes are sampled without the calls still in flight."""
GATHER_MAX_S = 0.5
"""The longest a ready episode waits for others' answers, however steadily they come in."""


@dataclass(frozen=True)
class EpisodeStart:
    """What one episode starts from."""

    prompt_ids: list[int]
    """The prompt's token ids (the data module's rendering; empty when the environment owns the data)."""
    seed: int
    """The episode's seed (:func:`~lit_fgrpo.environments.episode.sample_seed` of its prompt's seed and index)."""
    row: Mapping[str, Any] = field(default_factory=dict)
    """What ``reset(**row)`` receives: ``prompt`` and the row's columns, as they are."""
    messages: list[dict[str, str]] | None = None
    """The prompt as chat messages (``[]``: the environment owns the data, ``reset``'s text is the prompt; ``None``:
    a left-truncated prompt, which a ``reset`` text cannot be appended to)."""
    environment: str = ""
    """The environment's name (the row's ``environment`` column when ``--rollout.environment`` is a mapping)."""


@dataclass
class _Pending:
    """What an episode's request in flight was for."""

    stage: str
    """``"start"``, ``"react"`` or ``"finish"``."""
    reaction: Reaction | None = None
    finish: tuple[str, bool] = ("", False)
    """The end reason and truncation of an episode whose ``get_reward`` is in flight."""


class EpisodeDriver:
    """Runs episodes of a run's environments.

    Args:
        environments: The checked environments and standalone tools (:func:`~lit_fgrpo.environments.base.load_environments`).
        turns: The chat turns per environment name (the tools each lists differ), or one for all.
        limits: Turns, tokens per episode, tokens per turn, context.
        call_timeout: Seconds one environment call may take (``None``: no limit).
        isolation: Where environment calls run (:data:`~lit_fgrpo.environments.workers.Isolation`).
    """

    def __init__(
        self,
        environments: EnvironmentSet | EnvironmentSpec,
        turns: ChatTurns | Mapping[str, ChatTurns],
        limits: EpisodeLimits,
        call_timeout: float | None = 60.0,
        isolation: Isolation = "process",
    ) -> None:
        if call_timeout is not None and not call_timeout > 0:
            raise ConfigError(f"--rollout.environment_timeout must be > 0 seconds or null, got {call_timeout}")
        if isinstance(environments, EnvironmentSpec):  # one environment, as load_environment gives it
            environments = EnvironmentSet({"": environments})
        self.environments = environments
        names = list(environments.specs) or [""]
        self.turns = dict(turns) if isinstance(turns, Mapping) else dict.fromkeys(names, turns)
        self.limits = limits
        self.schemas = {name: environments.tool_schemas(name) for name in names}
        self.pool = WorkerPool(
            {name: spec.make for name, spec in environments.specs.items()}, environments.tools, isolation, call_timeout
        )
        self.seconds: dict[str, float] = dict.fromkeys(("generate", "environment", "driver"), 0.0)
        """Wall-clock seconds of the last :meth:`run`: ``generate``, ``environment`` (waiting with nothing to sample)
        and ``driver``."""
        self.workers: list[Worker] = []
        """The workers of the last :meth:`run`'s episodes, in order (their instances serve ``environments=``)."""

    def close(self) -> None:
        """End every worker."""
        self.pool.close()

    def views(self, episodes: Sequence[Episode]) -> list[Any]:
        """What reward functions receive as ``environments=``: each episode's instance (or its view in a worker
        process), ``None`` for an unscorable one. Valid until the next :meth:`run`."""
        return [
            None
            if e.unscorable is not None or e.environment_name not in self.environments.specs
            else w.view(e.environment_name)
            for e, w in zip(episodes, self.workers)
        ]

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        starts: Sequence[EpisodeStart],
        generate: Generate,
        join: Callable[[], None] | None = None,
        lockstep: bool = False,
    ) -> list[Episode]:
        """Run the episodes to their end.

        Args:
            starts: One per episode.
            generate: The engine's sampling.
            join: With ``lockstep``, called once for each of the ``max_turns`` rounds the episodes did not need (an
                engine the ranks share samples in collective rounds: every rank takes part in exactly ``max_turns``).
            lockstep: Each round waits for every environment (an engine the ranks share).
        """
        self.seconds = dict.fromkeys(("generate", "environment", "driver"), 0.0)
        began = time.perf_counter()
        episodes = [self._episode(start) for start in starts]
        self.workers = workers = self.pool.take(len(starts))
        pending: dict[int, _Pending] = {}
        ready: list[int] = []
        for i, (start, episode) in enumerate(zip(starts, episodes)):
            if episode.ended:
                continue
            if not self.environments.specs:  # standalone tools only: nothing to make or reset
                self._started(episode, start, None)
                ready.append(i)
                continue
            calls = [Call("reset", start.environment, "reset", kwargs=dict(start.row))]
            if start.environment not in workers[i].made:
                calls.insert(0, Call("make", start.environment))
                workers[i].made.add(start.environment)
            self._submit(workers[i], calls, pending, i, _Pending("start"))
        index = {id(w): i for i, w in enumerate(workers)}
        rounds = 0
        while pending or ready:
            waited = time.perf_counter()
            busy = [workers[i] for i in pending]
            if ready and not lockstep:
                now = time.monotonic()
                gather_until, give_up = now + GATHER_S, now + GATHER_MAX_S
                while busy and (left := min(gather_until, give_up) - time.monotonic()) > 0:
                    got = self.pool.wait(busy, left)
                    for worker, outcomes in got:
                        self._answer(episodes, starts, workers, pending, ready, index[id(worker)], outcomes)
                    if got:  # answers are still coming: give the next one as long again
                        gather_until = time.monotonic() + GATHER_S
                    busy = [workers[i] for i in pending]
            elif busy:
                for worker, outcomes in self.pool.wait(busy, None if lockstep or not ready else 0.0):
                    self._answer(episodes, starts, workers, pending, ready, index[id(worker)], outcomes)
                if lockstep and pending:
                    continue
            self.seconds["environment"] += time.perf_counter() - waited
            if ready:
                batch, ready = sorted(ready), []
                self._turn(episodes, batch, generate, workers, pending, ready)
                rounds += 1
        if lockstep and join is not None:
            for _ in range(self.limits.max_turns - rounds):
                join()
        self.seconds["driver"] = time.perf_counter() - began - self.seconds["generate"] - self.seconds["environment"]
        return episodes

    def _episode(self, start: EpisodeStart) -> Episode:
        messages = None if start.messages is None else [dict(m) for m in start.messages]
        episode = Episode(list(start.prompt_ids), int(start.seed), messages=messages or [])
        episode.environment_name = start.environment
        episode.prompt_messages = messages
        if start.environment not in self.turns:
            known = ", ".join(repr(n) for n in self.environments.specs)
            episode.end("fault", unscorable=f"the row's environment {start.environment!r} is not one of {known}")
            episode.fault_kind = "routing"
        return episode

    def _submit(self, worker: Worker, calls: list[Call], pending: dict[int, _Pending], i: int, what: _Pending) -> None:
        worker.submit(calls)
        pending[i] = what

    def _answer(
        self,
        episodes: list[Episode],
        starts: Sequence[EpisodeStart],
        workers: list[Worker],
        pending: dict[int, _Pending],
        ready: list[int],
        i: int,
        outcomes: list[Any],
    ) -> None:
        """An episode's request is answered: it becomes ready, waits for ``get_reward``, or ends."""
        what = pending.pop(i)
        episode = episodes[i]
        if outcomes and outcomes[-1][0] == "fault":
            self._fault(episode, outcomes[-1][1], _fault_kind(outcomes[-1][1]))
            return
        try:
            if what.stage == "start":
                self._started(episode, starts[i], outcomes[-1][1])
            elif what.stage == "finish":
                episode.reward = outcomes[-1][1]
                episode.end(*what.finish)
                return
            else:
                assert what.reaction is not None
                self._reacted(episode, what.reaction, outcomes)
        except EnvironmentFault as fault:  # the chat template failed at run time, or reset gave no prompt
            self._fault(episode, fault.reason, "template" if "template" in fault.reason else "reset")
            return
        if episode.live and episode.finish_reason is None:
            ready.append(i)
        elif episode.live:
            self._finish(episode, workers[i], pending, i)

    def _started(self, episode: Episode, start: EpisodeStart, observation: str | None) -> None:
        turns = self.turns[episode.environment_name]
        if start.messages and observation is None and turns.renders_prompts:  # its tools listed, its own template
            episode.prompt_ids = turns.prompt_ids(start.messages)
        if start.messages == []:  # environment-owned data: reset's text is the prompt
            if observation is None:
                raise EnvironmentFault("reset returned no prompt, and the row has none (environment-owned data)")
            episode.messages = [{"role": "user", "content": observation}]
            episode.prompt_ids = turns.prompt_ids(episode.messages)
        elif observation is not None:
            if start.messages is None:
                raise EnvironmentFault(
                    "reset returned text to append to the prompt, but the prompt was cut on the left (no messages to "
                    "append it to): raise --data.prompts.max_length"
                )
            messages = [dict(m) for m in start.messages]
            users = [k for k, m in enumerate(messages) if m.get("role") == "user"]
            if users:
                messages[users[-1]]["content"] = f"{messages[users[-1]]['content']}{observation}"
            else:
                messages.append({"role": "user", "content": observation})
            episode.messages = messages
            episode.prompt_ids = turns.prompt_ids(messages)
        if episode.room(self.limits) < 1:
            episode.finish_reason = ("prompt fills the context", True)

    def _turn(
        self,
        episodes: list[Episode],
        batch: list[int],
        generate: Generate,
        workers: list[Worker],
        pending: dict[int, _Pending],
        ready: list[int],
    ) -> None:
        """One ``generate`` call for the ready episodes, then each one's reaction sent to its worker."""
        rooms = [episodes[i].room(self.limits) for i in batch]
        start = time.perf_counter()
        outputs = generate(
            [episodes[i].token_ids() for i in batch],
            rooms,
            [turn_seed(episodes[i].seed, episodes[i].turns) for i in batch],
        )
        self.seconds["generate"] += time.perf_counter() - start
        if len(outputs) != len(batch):
            raise ValueError(f"generate returned {len(outputs)} rows for {len(batch)} episodes")
        for i, room, (ids, logprobs, finished) in zip(batch, rooms, outputs):
            episode = episodes[i]
            ids, logprobs = list(ids), None if logprobs is None else list(logprobs)
            if len(ids) > room:  # the engine sampled past this row's cap: its first `room` tokens are the sample
                ids, logprobs, finished = ids[:room], None if logprobs is None else logprobs[:room], False
            turns = self.turns[episode.environment_name]
            episode.add_model_turn(ids, logprobs, turns.decode(ids))
            reaction = plan_reaction(
                episode.messages[-1]["content"],
                turns,
                self.schemas[episode.environment_name],
                self.environments,
                episode.environment_name,
                cut=not finished,
            )
            for kind in reaction.invalid:
                episode.invalid_calls[kind] += 1
            if reaction.calls:
                self._submit(workers[i], reaction.calls, pending, i, _Pending("react", reaction))
                continue
            self._reacted(episode, reaction, [])
            if episode.finish_reason is None:
                ready.append(i)
            else:
                self._finish(episode, workers[i], pending, i)

    def _reacted(self, episode: Episode, reaction: Reaction, outcomes: list[Any]) -> None:
        """Append the environment's answer to a model turn, or mark the episode to finish."""
        messages, done = reaction.messages(outcomes, episode)
        if done:
            episode.messages += [{"role": m["role"], "content": m["content"]} for m in messages]
            episode.finish_reason = (reaction.done_reason, reaction.cut)
            return
        if reaction.cut:
            episode.finish_reason = ("turn cut at max tokens", True)
            return
        if episode.turns >= self.limits.max_turns:
            episode.finish_reason = ("max_turns", True)
            return
        turns = self.turns[episode.environment_name]
        needs_end = episode.segments[-1].ids[-1:] != [turns.end_of_turn_id]  # stopped at another stop token
        fitted = fit_messages(turns, messages, episode.tokens_left(self.limits) - needs_end - 1)
        if fitted is None:  # not even the turn markers fit: no room for another reply
            episode.finish_reason = ("token budget", True)
            return
        messages, ids = fitted
        if needs_end:
            ids = [turns.end_of_turn_id, *ids]
        episode.messages += [{"role": m["role"], "content": m["content"]} for m in messages]
        episode.add_environment_turn(ids, reaction.role)

    def _finish(self, episode: Episode, worker: Worker, pending: dict[int, _Pending], i: int) -> None:
        """End an episode; a scorable one's environment is asked for its reward first (a fault there: unscorable)."""
        assert episode.finish_reason is not None
        spec = self.environments.spec(episode.environment_name)
        if spec is not None and spec.has_reward:
            self._submit(
                worker,
                [Call("get_reward", episode.environment_name, "get_reward")],
                pending,
                i,
                _Pending("finish", finish=episode.finish_reason),
            )
        else:
            episode.end(*episode.finish_reason)

    def _fault(self, episode: Episode, reason: str, kind: str) -> None:
        episode.fault_kind = kind
        episode.end("fault", unscorable=reason)


def _fault_kind(reason: str) -> str:
    """A fault's kind for the per-step counts: which call failed, or ``timeout`` / ``worker``."""
    if "timed out" in reason:
        return "timeout"
    if "worker died" in reason:
        return "worker"
    for kind, marker in (
        ("constructor", "constructor"),
        ("get_reward", "get_reward"),
        ("reset", "reset"),
        ("step", "step"),
        ("template", "template"),
    ):
        if marker in reason:
            return kind
    return "other"
