"""``RolloutCollector``: prompt records in, a scored :class:`~lit_fgrpo.rollout.batch.RolloutBatch` out.

The one sampling path of the library: training and validation rollouts (through
:class:`~lit_fgrpo.callbacks.RolloutCallback`), the maze warm-start evaluation and the ΔNLL_rare pool all sample
here. For P records and ``sampling.n = G`` it

1. samples G completions per prompt with the engine (rows prompt-major: row ``i * G + j``),
2. decodes them and scores them with the reward functions (weighted sum) and the correctness verdict,
3. packs prompt + completion into padded tensors (:func:`~lit_fgrpo.engines.base.pad_rollouts`).

With an environment (``--rollout.environment``) each of the G samples is a multi-turn episode instead, run and
packed by :class:`~lit_fgrpo.rollout.episodes.EpisodeRollouts` into the same kind of batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lit_fgrpo.distributed.rank_layout import prompt_seeds
from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig, pad_rollouts
from lit_fgrpo.rewards import RewardFn, score_completions
from lit_fgrpo.rewards.base import RewardResult
from lit_fgrpo.rewards.guarded_call import Isolation
from lit_fgrpo.rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from lit_fgrpo.data.records import PromptRecord
    from lit_fgrpo.rollout.episodes import EpisodeRollouts


def pad_id_of(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its EOS id (padded positions are masked, so only the type matters)."""
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def columns_per_completion(records: Sequence[PromptRecord], num_generations: int) -> dict[str, list[Any]]:
    """Expand per-prompt columns to per-completion lists (prompt-major: row ``i * G + j``), ``None`` where absent."""
    names = sorted({name for record in records for name in record.columns})
    return {name: [record.columns.get(name) for record in records for _ in range(num_generations)] for name in names}


class RolloutCollector:
    """Sample, score and pack rollouts for a list of prompt records.

    Args:
        engine: the generation backend.
        tokenizer: decodes completions for the reward functions.
        reward_funcs: reward functions ``f(prompts, completions, **columns) -> list[float | None]``.
        reward_weights: one weight per reward function (default all 1).
        correctness_fn: the verdict whose score ``>= correct_threshold`` marks a completion correct (mu_hat);
            default the first reward function.
        correct_threshold: score at or above which a completion is correct.
        pad_token_id: filler id of the padded tensors (default: the tokenizer's pad, else EOS).
        mask_truncated: no loss on completions cut at ``max_tokens`` (DAPO's overlong filtering).
        reward_timeout: seconds one reward call may take before its rows become unscorable (None = no limit).
        reward_isolation: ``"thread"`` or ``"process"`` (functions that are not thread-safe); with a timeout.
        episodes: multi-turn episodes instead of one reply per sample (``None``: single-turn).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        reward_funcs: Sequence[RewardFn],
        reward_weights: Sequence[float] | None = None,
        correctness_fn: RewardFn | None = None,
        correct_threshold: float = 0.5,
        pad_token_id: int | None = None,
        mask_truncated: bool = False,
        reward_timeout: float | None = None,
        reward_isolation: Isolation = "thread",
        episodes: EpisodeRollouts | None = None,
    ) -> None:
        if not reward_funcs:
            raise ValueError("RolloutCollector needs at least one reward function")
        if reward_weights is not None and len(reward_weights) != len(reward_funcs):
            raise ValueError(
                f"RolloutCollector: {len(reward_weights)} reward_weights for {len(reward_funcs)} reward functions"
            )
        self.engine = engine
        self.tokenizer = tokenizer
        self.reward_funcs = list(reward_funcs)
        self.reward_weights = None if reward_weights is None else list(reward_weights)
        self.correctness_fn = correctness_fn if correctness_fn is not None else self.reward_funcs[0]
        self.correct_threshold = correct_threshold
        self.pad_token_id = pad_id_of(tokenizer) if pad_token_id is None else int(pad_token_id)
        self.mask_truncated = mask_truncated
        self.reward_timeout = reward_timeout
        self.last: RolloutBatch | None = None
        """The rollout packed last (its first rows are the probe of the next weight push)."""
        self.reward_isolation: Isolation = reward_isolation
        self.episodes = episodes
        """The multi-turn episodes' driver, limits and turn sampling (``None``: one reply per sample)."""

    def score(
        self,
        records: Sequence[PromptRecord],
        completions: Sequence[str],
        extra_columns: dict[str, list[Any]],
        group_size: int,
    ) -> RewardResult:
        """Score ``P * G`` completions (prompt-major) with this collector's rewards, verdict, timeout and isolation.

        The reward functions receive each prompt's own columns expanded per completion, then ``extra_columns``.
        """
        prompts = [record.prompt for record in records for _ in range(group_size)]
        columns: dict[str, Any] = dict(columns_per_completion(records, group_size)) | extra_columns
        return score_completions(
            prompts,
            completions,
            columns,
            self.reward_funcs,
            self.reward_weights,
            self.correctness_fn,
            self.correct_threshold,
            reward_timeout=self.reward_timeout,
            reward_isolation=self.reward_isolation,
            group_size=group_size,
        )

    def collect(
        self,
        records: Sequence[PromptRecord],
        sampling: SamplingConfig,
        seed: int | None = None,
        step: int = 0,
        stream: int = 0,
    ) -> RolloutBatch:
        """Sample ``sampling.n`` completions per record, score them and pack a :class:`RolloutBatch`.

        With a base seed, prompt ``p`` is sampled with its own seed
        ``prompt_seed(base, record.position, step, stream)`` (the record's index in ``records`` when it has no
        stream position), so what a prompt gets depends on its global position and the step, not on the rank
        that holds it or the prompts that share its ``generate`` call.

        Args:
            records: P prompt records (``prompt``, ``prompt_ids``, ``columns`` for the reward functions).
            sampling: sampling settings; ``sampling.n`` is G.
            seed: overrides ``sampling.seed`` as the base seed (``None`` keeps it; both ``None``: unseeded).
            step: the trainer's global step (repeated evaluation passes and training steps draw afresh).
            stream: which stream the records come from (0 train, 1 validation, 2 test: their positions overlap).

        Returns:
            The rollout: tensors (B = P * G rows, prompt-major), (P, G) rewards and verdicts, texts, token ids and
            ``stats`` (``tokens_per_s``, ``generation_seconds``, ``frac_truncated``, ``generated_tokens``,
            ``failed_*``, ``reward_*``, among them ``reward_nonfinite`` and ``reward_timeouts``: unscorable rows by
            cause, over all functions).
        """
        if seed is not None:
            sampling = replace(sampling, seed=seed)
        self.engine.wake_up()
        if self.episodes is not None:
            self.last = self.episodes.collect(self, records, sampling, step, stream)
            return self.last
        P, G = len(records), sampling.n
        prompt_ids = [list(record.prompt_ids) for record in records]
        start = time.perf_counter()
        seeds = None
        if sampling.seed is not None:
            positions = [i if record.position is None else record.position for i, record in enumerate(records)]
            seeds = prompt_seeds(sampling.seed, positions, step, stream)
        generation = self.engine.generate(prompt_ids, sampling, seeds)
        gen_seconds = time.perf_counter() - start
        completions = self.tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)
        prompts = [record.prompt for record in records for _ in range(G)]
        lengths = [len(ids) for ids in generation.completion_ids]
        scored = self.score(records, completions, {"completion_length": lengths}, G)
        ids, attn, mask, sampling_logp = pad_rollouts(
            prompt_ids, generation, G, self.pad_token_id, self.mask_truncated
        )  # (B, Tp + T), (B, Tp + T), (B, T), (B, T)
        num_tokens = sum(len(c) for c in generation.completion_ids)
        stats = {
            "tokens_per_s": num_tokens / max(gen_seconds, 1e-9),
            "generation_seconds": gen_seconds,
            "frac_truncated": 1.0 - sum(generation.finished) / max(len(generation.finished), 1),
            "generated_tokens": float(num_tokens),
        }
        stats |= scored.stats()
        rollout = RolloutBatch(
            input_ids=ids,
            attention_mask=attn,
            completion_mask=mask,
            rewards=scored.rewards.view(P, G),
            correct=scored.correct.view(P, G),
            max_completion_length=sampling.max_tokens,
            sampling_logp=sampling_logp,
            prompts=prompts,
            completions=completions,
            prompt_ids=prompt_ids,
            completion_ids=[list(c) for c in generation.completion_ids],
            stats=stats,
        )
        self.last = rollout
        return rollout

    def close(self) -> None:
        """End the episodes' environment workers (none for single-turn rollouts)."""
        if self.episodes is not None:
            self.episodes.close()

    def join_round(self, sampling: SamplingConfig) -> None:
        """Take part, without prompts of this rank's own, in the engine rounds one :meth:`collect` makes (one, or
        ``max_turns`` for episodes): dynamic sampling's skipping ranks, with an engine the ranks share."""
        if self.episodes is not None:
            self.episodes.join_rounds(self.engine, sampling)
        else:
            self.engine.join_round(sampling)
