"""The driver on a real (tiny, random) policy through the HF engine: what the wiring step will plug in.

The adapter below is the whole seam: one ``engine.generate`` call per turn with ``n=1``, the row seeds the driver
gives, and ``max_tokens`` the largest cap (the driver cuts a row at its own cap: the first tokens of a longer sample
are a sample of the shorter one). References: the engine called on each row alone (so batch layout changes nothing),
and the policy's teacher-forced log-probs of the packed rows (so the sampling log-probs sit on the model's tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.environments import (
    ChatTurns,
    EpisodeDriver,
    EpisodeLimits,
    EpisodeStart,
    load_environment,
    pad_training_rows,
    sample_seed,
    training_row,
    turn_seed,
)
from lit_fgrpo.models.logprobs import completion_logprobs
from tests.environments.tiny_chat import chat_tokenizer, prompt_ids, tiny_policy


def engine_generate(engine: HFEngine, sampling: SamplingConfig, calls: list[Any]) -> Any:
    def generate(prompts: list[list[int]], caps: list[int], seeds: list[int]) -> list[Any]:
        calls.append((prompts, caps, seeds))
        out = engine.generate(prompts, replace(sampling, n=1, max_tokens=max(caps)), seeds)
        assert out.sampling_logprobs is not None
        return list(zip(out.completion_ids, out.sampling_logprobs, out.finished))

    return generate


def setup() -> tuple[Any, HFEngine, SamplingConfig, EpisodeDriver]:
    tokenizer = chat_tokenizer()
    model = tiny_policy()
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    stops = list(range(3, len(tokenizer), 4))  # a quarter of the vocabulary ends a reply: short random turns
    sampling = SamplingConfig(n=1, max_tokens=12, stop_token_ids=stops)
    limits = EpisodeLimits(max_turns=3, max_episode_tokens=96, max_turn_tokens=12)
    driver = EpisodeDriver(load_environment("retry", {"max_attempts": 3}), ChatTurns(tokenizer), limits)
    return model, engine, sampling, driver


def starts() -> list[EpisodeStart]:
    rows = [("What is 2 + 3?", "5"), ("What is 4 + 4?", "8")]
    return [
        EpisodeStart(prompt_ids(q), sample_seed(100 + p, j), {"prompt": q, "answer": a})
        for p, (q, a) in enumerate(rows)
        for j in range(3)
    ]


def test_a_real_policy_runs_multi_turn_episodes_token_in_token_out() -> None:
    model, engine, sampling, driver = setup()
    calls: list[Any] = []
    episodes = driver.run(starts(), engine_generate(engine, sampling, calls), lockstep=True)
    assert len(calls) == max(e.turns for e in episodes) <= 3
    assert [len(c[0]) for c in calls] == [sum(e.turns > k for e in episodes) for k in range(len(calls))]
    assert sum(e.turns for e in episodes) > len(episodes)  # some episodes went on after "Wrong, try again."
    # each model turn again on its own (its prefix, seed and cap): the same tokens and log-probs
    limits = driver.limits
    for episode in episodes:
        prefix, turn = list(episode.prompt_ids), 0
        for segment in episode.segments:
            if segment.trained:
                cap = min(
                    limits.max_turn_tokens or 10**9, limits.max_episode_tokens - (len(prefix) - len(episode.prompt_ids))
                )
                alone = engine.generate([prefix], replace(sampling, max_tokens=cap), [turn_seed(episode.seed, turn)])
                assert segment.ids == alone.completion_ids[0]
                assert alone.sampling_logprobs is not None and segment.logprobs is not None
                torch.testing.assert_close(
                    torch.tensor(segment.logprobs), torch.tensor(alone.sampling_logprobs[0]), atol=1e-5, rtol=0
                )
                turn += 1
            prefix += segment.ids
    # the packed rows' sampling log-probs are the policy's own on every model token
    rows = [training_row(e) for e in episodes]
    ids, attn, mask, sampling_logp = pad_training_rows(rows, chat_tokenizer().pad_token_id)
    with torch.no_grad():
        trainer_logp = completion_logprobs(model, ids, attn, mask.shape[1]).logp  # (B, T)
    environment_tokens = (mask == 0) & (attn[:, -mask.shape[1] :] == 1)  # (B, T) read, not trained
    assert sampling_logp is not None and mask.sum() > 0 and environment_tokens.any()
    torch.testing.assert_close(trainer_logp * mask, sampling_logp * mask, atol=1e-4, rtol=0)


def test_episodes_that_do_not_wait_for_each_other_sample_what_lockstep_samples() -> None:
    """The asynchronous driver (each episode's turn sampled as soon as its environment answers, in whatever company)
    gives every episode the same tokens and log-probs as lockstep: each row samples with its own seed and turn."""
    _, engine, sampling, driver = setup()
    try:
        lockstep = driver.run(starts(), engine_generate(engine, sampling, []), lockstep=True)
        free = driver.run(starts(), engine_generate(engine, sampling, []))
        assert [e.token_ids() for e in free] == [e.token_ids() for e in lockstep]
        assert [e.reward for e in free] == [e.reward for e in lockstep]
        for a, b in zip(free, lockstep):
            for x, y in zip(a.segments, b.segments):
                if x.trained:
                    torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    finally:
        driver.close()
