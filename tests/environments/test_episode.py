"""One episode as one training row: the loss mask and the sampling log-probs against a hand-built two-turn episode."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.distributed.rank_layout import prompt_seed
from lit_fgrpo.environments import Episode, EpisodeLimits, pad_training_rows, sample_seed, training_row, turn_seed
from lit_fgrpo.errors import ConfigError


def two_turn_episode() -> Episode:
    """prompt [1 2 3] | model [10 11 12] | user [20 21] | model [13 14]."""
    episode = Episode(prompt_ids=[1, 2, 3], seed=7, messages=[{"role": "user", "content": "What is 2 + 3?"}])
    episode.add_model_turn([10, 11, 12], [-0.1, -0.2, -0.3], "It is 6.")
    episode.messages.append({"role": "user", "content": "Wrong, try again."})
    episode.add_environment_turn([20, 21], "user")
    episode.add_model_turn([13, 14], [-0.4, -0.5], "5")
    episode.end("done")
    return episode


def test_the_model_tokens_carry_the_loss_and_their_log_probs() -> None:
    row = training_row(two_turn_episode())
    assert row.prompt_ids == [1, 2, 3]
    assert row.completion_ids == [10, 11, 12, 20, 21, 13, 14]
    assert row.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert row.sampling_logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert row.messages == [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "It is 6."},
        {"role": "user", "content": "Wrong, try again."},
        {"role": "assistant", "content": "5"},
    ]
    assert (row.turns, row.truncated, row.unscorable, row.reward) == (2, False, None, None)


def test_rows_pack_into_the_training_steps_tensors() -> None:
    short = Episode(prompt_ids=[5, 6], seed=1)
    short.add_model_turn([30], [-0.7], "x")
    ids, attn, mask, logp = pad_training_rows([training_row(two_turn_episode()), training_row(short)], pad_token_id=0)
    assert ids.tolist() == [[1, 2, 3, 10, 11, 12, 20, 21, 13, 14], [0, 5, 6, 30, 0, 0, 0, 0, 0, 0]]
    assert attn.tolist() == [[1] * 10, [0, 1, 1, 1, 0, 0, 0, 0, 0, 0]]  # environment tokens are read ...
    assert mask.tolist() == [[1, 1, 1, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0, 0]]  # ... never trained on
    assert logp is not None
    torch.testing.assert_close(logp, torch.tensor([[-0.1, -0.2, -0.3, 0, 0, -0.4, -0.5], [-0.7, 0, 0, 0, 0, 0, 0]]))
    no_logp = Episode(prompt_ids=[5], seed=1)
    no_logp.add_model_turn([30], None, "x")
    assert training_row(no_logp).sampling_logprobs is None
    assert pad_training_rows([training_row(no_logp), training_row(short)], 0)[3] is None


def test_an_unscorable_episode_trains_nothing_and_a_truncated_one_only_without_mask_truncated() -> None:
    broken = two_turn_episode()
    broken.end("fault", unscorable="step raised ValueError: boom")
    row = training_row(broken)
    assert row.loss_mask == [0] * 7 and row.unscorable == "step raised ValueError: boom"
    assert broken.end_reason == "done"  # ended earlier: the first reason stays
    cut = two_turn_episode()
    cut.end("max_turns", truncated=True)
    assert training_row(cut).loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert training_row(cut, mask_truncated=True).loss_mask == [0] * 7


def test_the_room_of_the_next_turn_is_the_tightest_limit() -> None:
    episode = two_turn_episode()  # 3 prompt + 7 completion tokens
    assert episode.room(EpisodeLimits(max_episode_tokens=10)) == 3
    assert episode.room(EpisodeLimits(max_episode_tokens=10, max_context=12)) == 2
    assert episode.room(EpisodeLimits(max_episode_tokens=10, max_turn_tokens=1)) == 1
    assert episode.tokens_left(EpisodeLimits(max_episode_tokens=10, max_turn_tokens=1)) == 3  # environment tokens
    assert episode.token_ids() == [1, 2, 3, 10, 11, 12, 20, 21, 13, 14]


def test_limits_are_checked_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^--rollout\.max_turns must be >= 1, got 0$"):
        EpisodeLimits(max_turns=0)
    with pytest.raises(ConfigError, match=r"^--rollout\.max_context must be >= 1, got -1$"):
        EpisodeLimits(max_context=-1)


def test_a_model_turn_needs_one_log_prob_per_token() -> None:
    with pytest.raises(ValueError, match="3 tokens but 2 log-probs"):
        Episode(prompt_ids=[1], seed=0).add_model_turn([1, 2, 3], [-1.0, -1.0], "")


def test_seeds_depend_on_the_prompt_seed_the_sample_and_the_turn_only() -> None:
    group = prompt_seed(1234, position=5, step=2)
    seeds = [sample_seed(group, j) for j in range(4)]
    turns = [turn_seed(seeds[0], k) for k in range(4)]
    assert seeds == [sample_seed(group, j) for j in range(4)]  # a pure function
    assert len(set(seeds + turns + [group])) == 9
    assert all(0 <= s < 2**63 for s in seeds + turns)
