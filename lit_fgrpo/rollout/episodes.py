"""Multi-turn episodes in the rollout path: the collector's branch when ``--rollout.environment`` is set.

:class:`EpisodeRollouts` is what :class:`~lit_fgrpo.rollout.collect.RolloutCollector` runs instead of one
``generate`` call when an environment is configured; everything after it (the schedules, the update, the
statistics over ranks, checkpoints) sees an ordinary :class:`~lit_fgrpo.rollout.batch.RolloutBatch`. For P records
and ``sampling.n = G`` it

1. starts G episodes per record (row ``i * G + j``, prompt-major as single-turn rows): episode ``j`` of prompt ``i``
   has the seed :func:`~lit_fgrpo.environments.sample_seed` of the prompt's own seed (``prompt_seed(base,
   position, step, stream)``, as the single-turn collector seeds it), so a run is reproducible and does not depend
   on the rank layout;
2. advances every live episode together, one ``engine.generate`` call per turn with ``n = 1`` and the same
   ``max_tokens`` (the turn's tokens) on every call and rank (:class:`~lit_fgrpo.environments.EpisodeDriver`); a
   rank whose episodes end early still takes part in each of the ``max_turns`` rounds of an engine the ranks share;
3. packs each episode as one training row (:func:`~lit_fgrpo.environments.pad_training_rows`): loss mask 1 on the
   model's tokens, 0 on the environment's, the sampling log-probs on the model's tokens;
4. scores the final verdict: the reward functions read the last assistant message (``completions``), the whole
   conversation (column ``messages``) and the environment's ``get_reward()`` (column ``environment_reward``, the
   reward function named ``environment``). An unscorable episode (an environment fault) gets reward NaN and
   verdict False: left out of mu_hat and the loss, counted in ``environment_errors``, never scored 0.

The model's context is kept ``max_tokens`` short (:func:`episode_context`): every request of a turn then fits the
engine, whichever row is longest.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lit_fgrpo.distributed.rank_layout import prompt_seeds
from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig
from lit_fgrpo.environments import (
    ROUTE_COLUMN,
    ChatTurns,
    Episode,
    EpisodeDriver,
    EpisodeStart,
    episode_stats,
    pad_training_rows,
    sample_seed,
    training_row,
)
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.notices import notice
from lit_fgrpo.rewards.base import RewardResult
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.rollout_settings import ENVIRONMENT_REWARD, RolloutSettings

if TYPE_CHECKING:
    from lit_fgrpo.data.records import PromptRecord

log = logging.getLogger(__name__)


class Scoring(Protocol):
    """What the episodes use of their :class:`~lit_fgrpo.rollout.collect.RolloutCollector`: its engine, padding and
    scoring."""

    engine: RolloutEngine
    pad_token_id: int

    def score(
        self,
        records: Sequence[PromptRecord],
        completions: Sequence[str],
        extra_columns: dict[str, list[Any]],
        group_size: int,
    ) -> RewardResult:
        """Score the completions with the collector's rewards (each prompt's columns, then ``extra_columns``)."""
        ...


FIRST_TURN = "correct_first_turn"
"""The statistic of the episodes that are correct after one model turn (for ``retry``: right at the first attempt)."""
TOOL_USE = "tool_use"
"""The share of episodes with at least one valid tool call (only where the environments have tools): a model that
"succeeds" without its tool, or never calls it, shows here."""
EPISODE_SHARES = (FIRST_TURN, TOOL_USE)
"""The per-episode shares a held-out evaluation reports beside pass@k, each weighted by its episodes."""


def environment_reward(prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
    """The reward function ``environment``: each episode's ``get_reward()`` (``None``, unscorable, without one)."""
    return list(columns.get("environment_reward") or [None] * len(completions))


environment_reward.__name__ = ENVIRONMENT_REWARD  # logged as rollout/reward_environment


def episode_context(policy_context: int | None, engine_context: int | None, turn_tokens: int) -> int | None:
    """The tokens (prompt included) an episode may fill: the model's context less one turn's ``max_tokens``, so that
    a request never asks the engine for more than its context (``None``: no limit known).

    Raises:
        ConfigError: If the context leaves no room for a turn.
    """
    known = [c for c in (policy_context, engine_context) if c]
    if not known:
        return None
    context = min(known)
    if context <= turn_tokens:
        raise ConfigError(
            f"--rollout.max_turn_tokens (else --rollout.sampling.max_tokens): a turn of {turn_tokens} tokens does not "
            f"fit the model's context of {context}"
        )
    return context - turn_tokens


def policy_context(policy: Any) -> int | None:
    """The policy's context length (``config.max_position_embeddings``), when its config states one."""
    config = getattr(policy, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


@dataclass(frozen=True)
class EpisodeRollouts:
    """The multi-turn part of a collector, built once per engine (:meth:`build`)."""

    driver: EpisodeDriver
    """The environment, its chat turns, limits and timeout."""
    turn_tokens: int
    """``max_tokens`` of every turn's ``generate`` call (the same on every rank; the driver cuts a row at its own cap)."""
    mask_truncated: bool
    """No loss on a truncated episode (``--rollout.mask_truncated_completions``)."""
    lockstep: bool = False
    """Every turn waits for every environment (``--rollout.episode_schedule lockstep``)."""

    @classmethod
    def build(
        cls, settings: RolloutSettings, tokenizer: Any, policy: Any, reward_funcs: Sequence[Any] = ()
    ) -> EpisodeRollouts:
        """From the settings (the environment already checked), the policy's tokenizer (its chat template is checked
        here: before the first step), the policy (its context) and the reward functions (for the one notice that
        tells where ours differs from TRL for them)."""
        if settings.environment_isolation == "process" and any(takes_environments(fn) for fn in reward_funcs):
            notice(
                log,
                "reward functions get environments= as views of the instances, which live in worker processes "
                "(--rollout.environment_isolation process): reading an attribute copies it, calling a method runs "
                "it there; set environment_isolation: thread to hand them the instances themselves, as TRL does",
            )
        environments = settings.environments
        assert environments is not None, "EpisodeRollouts needs --rollout.environment or --rollout.tools"
        names = list(environments.specs) or [""]
        turns = {
            name: ChatTurns(
                tokenizer,
                settings.end_of_turn,
                tools=environments.tool_schemas(name),
                call_format=settings.tool_call_format,
                chat_template=settings.chat_template,
                chat_template_kwargs=settings.chat_template_kwargs,
            )
            for name in names
        }
        engine_context = (settings.engine_kwargs or {}).get("max_model_len")
        context = episode_context(policy_context(policy), engine_context, settings.turn_tokens)
        limits = settings.episode_limits(context)
        driver = EpisodeDriver(
            environments, turns, limits, settings.environment_timeout, settings.environment_isolation
        )
        lockstep = settings.episode_schedule == "lockstep"
        return cls(driver, settings.turn_tokens, settings.mask_truncated_completions, lockstep)

    def close(self) -> None:
        """End the environment workers (no process or thread outlives the run)."""
        self.driver.close()

    def turn_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """One turn's sampling: one continuation per episode, at most :attr:`turn_tokens`, stopping at the end-of-turn
        token too (Gemma's ``<end_of_turn>`` is not its EOS)."""
        ends = {turns.end_of_turn_id for turns in self.driver.turns.values()}
        stops = list(sampling.stop_token_ids) + sorted(ends - set(sampling.stop_token_ids))
        return replace(sampling, n=1, max_tokens=self.turn_tokens, stop_token_ids=stops)

    def join_rounds(self, engine: RolloutEngine, sampling: SamplingConfig) -> None:
        """Take part, without episodes, in the ``max_turns`` rounds a collect makes (dynamic sampling's skipping
        ranks, with an engine the ranks share)."""
        for _ in range(self.driver.limits.max_turns):
            engine.join_round(self.turn_sampling(sampling))

    def starts(self, records: Sequence[PromptRecord], sampling: SamplingConfig, step: int, stream: int) -> list[Any]:
        """G episode starts per record, prompt-major, each with its own seed and its record's row."""
        positions = [i if record.position is None else record.position for i, record in enumerate(records)]
        if sampling.seed is not None:
            group_seeds = prompt_seeds(sampling.seed, positions, step, stream)
        else:  # unseeded: the global RNG, as an unseeded engine call draws from it
            group_seeds = torch.randint(0, 2**62, (len(records),)).tolist()
        environments = self.driver.environments
        starts = []
        for record, group_seed in zip(records, group_seeds):
            name = str(record.columns.get(ROUTE_COLUMN)) if environments.routed else ""
            prompt = record.prompt_ids  # the driver renders it again where the episodes' template must (its tools)
            row = dict(record.columns)  # as they are: an int column stays an int (TRL passes the row's values)
            if record.messages != []:  # environment-owned data has no prompt to pass
                row = {"prompt": record.messages if record.messages is not None else record.prompt, **row}
            for j in range(sampling.n):
                starts.append(EpisodeStart(list(prompt), sample_seed(group_seed, j), row, record.messages, name))
        return starts

    def run(self, engine: RolloutEngine, starts: Sequence[EpisodeStart], sampling: SamplingConfig) -> list[Episode]:
        """The episodes, run to their end: one ``engine.generate`` call per turn for all live episodes."""
        turn = self.turn_sampling(sampling)

        def generate(prompts: list[list[int]], caps: list[int], seeds: list[int]) -> list[Any]:
            out = engine.generate(prompts, turn, seeds)
            logprobs: Sequence[list[float] | None] = out.sampling_logprobs or [None] * len(out.completion_ids)
            return list(zip(out.completion_ids, logprobs, out.finished))

        # an engine the ranks share: every rank makes the same rounds
        lockstep = self.lockstep or engine.collective_rounds
        return self.driver.run(starts, generate, join=lambda: engine.join_round(turn), lockstep=lockstep)

    def collect(
        self,
        collector: Scoring,
        records: Sequence[PromptRecord],
        sampling: SamplingConfig,
        step: int,
        stream: int,
    ) -> RolloutBatch:
        """The collector's :meth:`~lit_fgrpo.rollout.collect.RolloutCollector.collect` for multi-turn episodes."""
        P, G = len(records), sampling.n
        starts = self.starts(records, sampling, step, stream)
        episodes = self.run(collector.engine, starts, sampling)
        rows = [training_row(episode, self.mask_truncated) for episode in episodes]
        ids, attn, mask, sampling_logp = pad_training_rows(rows, collector.pad_token_id)  # (B, Tp+T) x2, (B, T) x2
        completions = [last_reply(episode) for episode in episodes]
        prompts = [record.prompt for record in records for _ in range(G)]
        model_tokens = [model_token_count(episode) for episode in episodes]
        extra: dict[str, list[Any]] = {
            "completion_length": model_tokens,
            "messages": [row.messages for row in rows],
            "environment_reward": [row.reward for row in rows],
            "environments": self.driver.views(episodes),  # TRL's reward functions read the instances
        }
        scored = collector.score(records, completions, extra, G)
        unscorable = torch.tensor([row.unscorable is not None for row in rows], dtype=torch.bool)  # (B,)
        warn_unscorable_groups(unscorable.view(P, G), episodes, G)
        rewards = scored.rewards.masked_fill(unscorable, float("nan"))  # (B,)
        correct = scored.correct & ~unscorable  # (B,)
        seconds = self.driver.seconds
        environments = self.driver.environments
        generated = sum(model_tokens)
        stats = {
            "tokens_per_s": generated / max(seconds["generate"], 1e-9),
            "generation_seconds": seconds["generate"],
            "environment_seconds": seconds["environment"],
            "frac_truncated": sum(row.truncated for row in rows) / max(len(rows), 1),
            "generated_tokens": float(generated),
            FIRST_TURN: float(sum(bool(c) and e.turns == 1 for c, e in zip(correct, episodes))) / len(rows),
            **episode_stats(episodes, environments.all_tools()),
        }
        if environments.all_tools():
            stats[TOOL_USE] = float(sum(sum(e.tool_calls.values()) > 0 for e in episodes)) / len(rows)
        stats |= scored.stats(scorable=~unscorable)
        return RolloutBatch(
            input_ids=ids,
            attention_mask=attn,
            completion_mask=mask,
            rewards=rewards.view(P, G),
            correct=correct.view(P, G),
            max_completion_length=self.driver.limits.max_episode_tokens,
            sampling_logp=sampling_logp,
            prompts=prompts,
            completions=completions,
            prompt_ids=[list(episodes[i * G].prompt_ids) for i in range(P)],  # (P,) as the episodes began
            completion_ids=[row.completion_ids for row in rows],
            stats=stats,
            row_prompt_ids=[row.prompt_ids for row in rows],
            conversations=[row.messages for row in rows],
            faults=[row.unscorable or "" for row in rows],
        )


_warned = False


def takes_environments(fn: Any) -> bool:
    """Whether a reward function names an ``environments`` parameter (TRL's reward functions for environments do)."""
    try:
        return "environments" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a C callable without a signature
        return False


def warn_unscorable_groups(unscorable: torch.Tensor, episodes: Sequence[Episode], group_size: int) -> None:
    """One notice, at the first step where every episode of some group is unscorable (an environment that never
    works is otherwise a run of zeros): how many groups, and the first episode's fault."""
    global _warned
    whole = unscorable.all(dim=1)  # (P,)
    if _warned or not bool(whole.any()):
        return
    _warned = True
    first = episodes[int(whole.nonzero()[0, 0]) * group_size]
    notice(
        log,
        "every episode of %d of %d groups is unscorable (left out of mu_hat and the loss); the first group's fault: "
        "%s. Fault counts by kind: rollout/environment_errors/<kind>",
        int(whole.sum()),
        unscorable.shape[0],
        first.unscorable,
    )


def last_reply(episode: Episode) -> str:
    """The episode's last assistant message (its final answer), ``""`` when the model never spoke."""
    replies = [m["content"] for m in episode.messages if m.get("role") == "assistant"]
    return replies[-1] if replies else ""


def model_token_count(episode: Episode) -> int:
    """Tokens the model sampled in the episode (its environment's not counted)."""
    return sum(len(segment.ids) for segment in episode.segments if segment.trained)


__all__ = [
    "EPISODE_SHARES",
    "FIRST_TURN",
    "TOOL_USE",
    "EpisodeRollouts",
    "environment_reward",
    "episode_context",
    "last_reply",
    "policy_context",
]
