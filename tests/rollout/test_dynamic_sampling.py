"""Dynamic sampling: P informative groups per batch, the rounds cap, exact data position; concat/select of groups.

The ``draw`` callable stands in for the rollout collector (engine + reward): it is the seam dynamic sampling is
written against, and a stream of prompts with known rewards makes every kept/dropped group checkable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lit_fgrpo.objectives import GroupWeight, group_advantages
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.group_filter import (
    DynamicSampling,
    Lockstep,
    concat_rollouts,
    dynamic_sample,
    informative_groups,
    select_groups,
)

G = 4
PAD = 0


def prompt_group(index: int, constant: bool, seed: int = 0) -> RolloutBatch:
    """The G completions of prompt ``index``: its prompt has 2 + index % 3 tokens, completions are ragged."""
    gen = torch.Generator().manual_seed(1000 * seed + index)
    tp, t = 2 + index % 3, 1 + index % 4
    prompt = torch.randint(3, 50, (tp,), generator=gen)
    lengths = torch.randint(1, t + 1, (G,), generator=gen)
    ids = torch.full((G, tp + t), PAD, dtype=torch.long)
    attn = torch.zeros(G, tp + t, dtype=torch.long)
    mask = torch.zeros(G, t)
    logp = torch.zeros(G, t)
    for row in range(G):
        n = int(lengths[row])
        ids[row, :tp] = prompt
        ids[row, tp : tp + n] = torch.randint(3, 50, (n,), generator=gen)
        attn[row, : tp + n] = 1
        mask[row, :n] = 1.0
        logp[row, :n] = -torch.rand(n, generator=gen)
    correct = torch.ones(1, G, dtype=torch.bool) if constant else (torch.arange(G) < 1 + index % (G - 1))[None, :]
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=mask,
        rewards=correct.double(),
        correct=correct,
        max_completion_length=4,
        sampling_logp=logp,
        prompts=[f"p{index}"] * G,
        completions=[f"p{index}c{row}" for row in range(G)],
        stats={"generation_seconds": 1.0, "tokens_per_s": float(index), "generated_tokens": float(lengths.sum())},
    )


class PromptStream:
    """Prompts 0, 1, 2, ... with a position; ``draw(k)`` consumes the next k (fewer at the end)."""

    def __init__(self, constant: Callable[[int], bool], length: int = 10_000, position: int = 0) -> None:
        self.constant = constant
        self.length, self.position = length, position
        self.calls: list[int] = []

    def draw(self, k: int) -> RolloutBatch:
        indices = list(range(self.position, min(self.position + k, self.length)))
        self.position += len(indices)
        self.calls.append(k)
        groups = [prompt_group(i, self.constant(i)) for i in indices]
        if not groups:
            return select_groups(prompt_group(0, False), [])
        return concat_rollouts(groups, PAD)


def group_ids(batch: RolloutBatch) -> list[int]:
    return [int(p[1:]) for p in batch.prompts[::G]]


def test_half_constant_groups_every_batch_has_p_informative_groups() -> None:
    stream = PromptStream(lambda i: i % 2 == 0)
    cfg = DynamicSampling(max_rounds=5, oversample=1.0)
    for _ in range(4):
        start = stream.position
        batch, stats = dynamic_sample(stream.draw, 6, cfg, pad_token_id=PAD)
        assert batch.num_prompts == 6 and stats.groups_kept == 6 and stats.groups_padded == 0
        assert informative_groups(batch.rewards).all()
        assert (group_advantages(batch.rewards) != 0).any(dim=1).all()
        # the first informative prompts in draw order, and the position advanced by every prompt drawn
        drawn = list(range(start, stream.position))
        assert group_ids(batch) == [i for i in drawn if i % 2][:6]
        assert stats.prompts_drawn == len(drawn) == sum(stream.calls[-stats.rounds :])
        assert batch.stats["dynamic_rounds"] == stats.rounds
        assert batch.stats["generation_seconds"] == float(stats.prompts_drawn)  # 1 s per prompt drawn, summed
        # the generation cost counts every drawn group, also the discarded ones (what a token budget charges)
        every_drawn = sum(float(prompt_group(i, i % 2 == 0).completion_mask.sum()) for i in drawn)
        assert batch.stats["generated_tokens"] == every_drawn > float(batch.completion_mask.sum())
        # rounds ask for the missing groups only: 6, then ceil(1.0 * missing), ...
        assert stream.calls[-stats.rounds] == 6 and all(c <= 6 for c in stream.calls[-stats.rounds :])


def test_round_cap_is_respected_and_short_batches_are_padded_or_refused() -> None:
    stream = PromptStream(lambda i: i % 5 != 0)  # one informative prompt in five
    batch, stats = dynamic_sample(stream.draw, 4, DynamicSampling(max_rounds=2, oversample=1.0))
    assert stats.rounds == 2 and len(stream.calls) == 2 and stream.calls == [4, 3]
    assert stats.prompts_drawn == 7 == stream.position
    assert stats.groups_kept == 2 and stats.groups_padded == 2 and batch.num_prompts == 4
    assert group_ids(batch) == [0, 5, 1, 2]  # informative first, then the earliest dropped groups
    assert informative_groups(batch.rewards).tolist() == [True, True, False, False]
    with pytest.raises(RuntimeError, match="dynamic_sampling.max_rounds"):
        dynamic_sample(PromptStream(lambda i: True).draw, 4, DynamicSampling(max_rounds=3, on_short="error"))


def test_oversampling_draws_more_and_surplus_is_consumed() -> None:
    stream = PromptStream(lambda i: i % 2 == 0)
    batch, stats = dynamic_sample(stream.draw, 4, DynamicSampling(oversample=2.0))
    assert stream.calls == [8] and stats.rounds == 1 and stats.prompts_drawn == 8
    assert group_ids(batch) == [1, 3, 5, 7] and stats.groups_informative == 4
    batch, stats = dynamic_sample(stream.draw, 3, DynamicSampling(oversample=2.0))
    assert group_ids(batch) == [9, 11, 13] and stats.groups_informative == 3 and stats.prompts_drawn == 6


def test_resume_continues_at_the_next_undrawn_prompt() -> None:
    """Saving stream.position (advanced by prompts_drawn) and restarting there equals an uninterrupted run."""
    cfg = DynamicSampling(max_rounds=4, oversample=1.5)
    straight = PromptStream(lambda i: i % 3 == 0)
    first, stats = dynamic_sample(straight.draw, 5, cfg)
    second, _ = dynamic_sample(straight.draw, 5, cfg)
    resumed = PromptStream(lambda i: i % 3 == 0, position=stats.prompts_drawn)
    again, _ = dynamic_sample(resumed.draw, 5, cfg)
    assert group_ids(again) == group_ids(second)
    assert torch.equal(again.input_ids, second.input_ids)
    assert min(group_ids(second)) > max(group_ids(first))


def test_group_weight_zero_groups_are_dropped() -> None:
    band = GroupWeight("band", low=0.3, high=0.8)  # mu_hat in {1/4, 2/4, 3/4}: keeps 2/4 and 3/4
    stream = PromptStream(lambda i: False)
    batch, stats = dynamic_sample(stream.draw, 4, DynamicSampling(max_rounds=10), group_weight=band)
    mu = batch.correct.double().mean(dim=1)
    assert ((mu > 0.3) & (mu < 0.8)).all() and stats.groups_padded == 0
    assert (group_advantages(batch.rewards, group_weight=band) != 0).any(dim=1).all()


def test_stream_running_out_pads_or_fails_with_a_clear_message() -> None:
    stream = PromptStream(lambda i: i % 2 == 0, length=5)
    batch, stats = dynamic_sample(stream.draw, 3, DynamicSampling(max_rounds=5))
    assert stats.prompts_drawn == 5 and stats.groups_kept == 2 and stats.groups_padded == 1
    with pytest.raises(RuntimeError, match="ran out"):
        dynamic_sample(PromptStream(lambda i: True, length=2).draw, 3, DynamicSampling(max_rounds=5))


class Ranks:
    """W ranks of one process group, simulated by threads: ``round_need`` is a MAX all-reduce behind a barrier."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.slots: list[tuple[int, bool]] = [(0, False)] * world
        self.calls: list[list[int]] = [[] for _ in range(world)]

    def lockstep(self, rank: int, stream: PromptStream) -> Lockstep:
        def round_need(missing: int, exhausted: bool) -> int:
            self.slots[rank] = (missing, exhausted)
            self.barrier.wait()
            need = 0 if any(done for _, done in self.slots) else max(m for m, _ in self.slots)
            self.calls[rank].append(need)
            self.barrier.wait()  # every rank has read the slots before the next round writes them
            return need

        def skip(k: int) -> int:
            stream.position += k
            return k

        return Lockstep(round_need, skip)

    def run(self, streams: list[PromptStream], P: int, cfg: DynamicSampling) -> list[tuple[RolloutBatch, Any]]:
        out: list[Any] = [None] * len(streams)

        def rank_main(rank: int) -> None:
            out[rank] = dynamic_sample(streams[rank].draw, P, cfg, lockstep=self.lockstep(rank, streams[rank]))

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(streams))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert all(o is not None for o in out), "a rank hung or failed"
        return out


def test_ranks_in_lockstep_make_the_same_rounds_and_draw_alike() -> None:
    """Rank 0 has one informative prompt in two, rank 1 one in five: rank 1 needs more rounds; rank 0 skips them."""
    cfg = DynamicSampling(max_rounds=10, oversample=1.5)
    rules = [lambda i: i % 2 == 0, lambda i: i % 5 != 0]
    for _ in range(3):  # three training steps: the cursors stay together from step to step
        streams = [PromptStream(rule) for rule in rules]
        solo = [dynamic_sample(PromptStream(rule).draw, 4, cfg)[0] for rule in rules]
        ranks = Ranks(2)
        (b0, s0), (b1, s1) = ranks.run(streams, 4, cfg)
        assert s0.rounds == s1.rounds > 1 and ranks.calls[0] == ranks.calls[1]
        assert s0.prompts_drawn == s1.prompts_drawn == streams[0].position == streams[1].position
        assert s0.prompts_skipped > 0 and s1.prompts_skipped == 0
        # each rank keeps what it keeps alone: the first P informative groups of its stream
        for batch, alone in zip((b0, b1), solo, strict=True):
            assert group_ids(batch) == group_ids(alone) and torch.equal(batch.input_ids, alone.input_ids)
        # the keep rate counts generated prompts only
        assert b0.stats["dynamic_keep_rate"] == s0.groups_informative / (s0.prompts_drawn - s0.prompts_skipped)


def test_ranks_in_lockstep_stop_together_when_one_stream_runs_out() -> None:
    cfg = DynamicSampling(max_rounds=10)
    streams = [PromptStream(lambda i: i % 2 == 0, length=3), PromptStream(lambda i: i % 2 == 0)]
    (b0, s0), (b1, s1) = Ranks(2).run(streams, 3, cfg)
    assert s0.rounds == s1.rounds and b0.num_prompts == b1.num_prompts == 3
    assert s0.groups_kept == 1 and s0.groups_padded == 2 and s1.groups_padded > 0


def test_informative_groups_is_nonzero_advantage_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(40, 5, generator=gen) < torch.rand(40, 1, generator=gen)).double()
    rewards[torch.rand(40, 5, generator=gen) < 0.2] = float("nan")
    rewards[:3] = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1], dtype=torch.float64)  # inexact constant mean
    for weight in (None, GroupWeight("maxrl"), GroupWeight("band", low=0.25, high=0.75), GroupWeight(gamma=1.0)):
        want = (group_advantages(rewards, group_weight=weight) != 0).any(dim=1)
        assert torch.equal(informative_groups(rewards, group_weight=weight), want)


def test_concat_and_select_keep_every_row_against_a_loop() -> None:
    parts = [prompt_group(i, i % 2 == 0) for i in range(5)]
    cat = concat_rollouts(parts, pad_token_id=PAD)
    tp = cat.input_ids.shape[1] - cat.completion_length
    for p, part in enumerate(parts):
        part_tp = part.input_ids.shape[1] - part.completion_length
        for g in range(G):
            row = p * G + g
            # prompt tokens right-aligned before tp, completion tokens from tp on, all else masked
            real = cat.input_ids[row][cat.attention_mask[row].bool()]
            assert torch.equal(real, part.input_ids[g][part.attention_mask[g].bool()])
            assert torch.equal(cat.input_ids[row, tp - part_tp : tp], part.input_ids[g, :part_tp])
            n = part.completion_length
            assert torch.equal(cat.completion_mask[row, :n], part.completion_mask[g])
            assert cat.completion_mask[row, n:].sum() == 0
            assert cat.sampling_logp is not None and part.sampling_logp is not None
            assert torch.equal(cat.sampling_logp[row, :n], part.sampling_logp[g])
    assert torch.equal(cat.rewards, torch.cat([p.rewards for p in parts]))
    pick = select_groups(cat, [3, 0])
    assert group_ids(pick) == [3, 0] and pick.completions[:G] == parts[3].completions
    assert torch.equal(pick.input_ids[G:], cat.input_ids[:G]) and torch.equal(pick.correct[1], cat.correct[0])
    with pytest.raises(ValueError, match="group sizes"):
        concat_rollouts([cat, _with_group_size(2)])


def _with_group_size(g: int) -> RolloutBatch:
    batch = prompt_group(0, False)
    rows = list(range(g))
    return RolloutBatch(
        batch.input_ids[rows],
        batch.attention_mask[rows],
        batch.completion_mask[rows],
        batch.rewards[:, :g],
        batch.correct[:, :g],
        4,
    )


def test_repadding_leaves_the_policy_logprobs_unchanged() -> None:
    """A real (tiny, offline) causal LM scores each row of the concatenation as it scored the row alone."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lit_fgrpo.models.logprobs import completion_logprobs

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = AutoModelForCausalLM.from_config(config).eval().double()
    parts = [prompt_group(i, False) for i in range(4)]
    cat = concat_rollouts(parts, pad_token_id=PAD)
    with torch.no_grad():
        whole = completion_logprobs(model, cat.input_ids, cat.attention_mask, cat.completion_length).logp
        for p, part in enumerate(parts):
            alone = completion_logprobs(model, part.input_ids, part.attention_mask, part.completion_length).logp
            n = part.completion_length
            got = whole[p * G : (p + 1) * G, :n] * part.completion_mask
            torch.testing.assert_close(got, alone * part.completion_mask, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_rounds": 0}, "dynamic_sampling.max_rounds"),
        ({"oversample": 0.5}, "dynamic_sampling.oversample"),
        ({"oversample": float("inf")}, "dynamic_sampling.oversample"),
        ({"on_short": "drop"}, "dynamic_sampling.on_short"),
    ],
)
def test_bad_config_names_the_setting(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DynamicSampling(**kwargs)
