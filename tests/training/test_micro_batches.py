"""plan_micro_batches and trim_rows against loops: every contributing row once, sorted, widths, unchanged log-probs."""

from __future__ import annotations

import torch

from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.training.micro_batches import (
    budget_chunks,
    padding_micro_batches,
    plan_micro_batches,
    plan_step,
    trim_rows,
)
from tests.training.tiny_setup import tiny_module


def test_plan_matches_a_loop_over_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    B = 37
    advantages = torch.randn(B, generator=gen)
    advantages[torch.rand(B, generator=gen) < 0.4] = 0.0  # zero-advantage rows
    lengths = torch.randint(0, 9, (B,), generator=gen)
    rows = torch.arange(3, 31)  # a mini-batch
    for skip in (True, False):
        plan = plan_micro_batches(rows, advantages, lengths, 5, skip)
        kept = [int(r) for r in rows if not (skip and advantages[r] == 0)]
        # reference: the kept rows ordered by (length, original position), cut into fives
        expected = sorted(kept, key=lambda r: (int(lengths[r]), kept.index(r)))
        assert [int(r) for m in plan for r in m.rows] == expected
        assert [len(m.rows) for m in plan] == [len(expected[i : i + 5]) for i in range(0, len(expected), 5)]
        for m in plan:
            assert m.width == max(1, max(int(lengths[r]) for r in m.rows)) and not m.padding
    all_zero = torch.zeros(B)
    assert plan_micro_batches(rows, all_zero, lengths, 5, True) == []
    padding = padding_micro_batches(rows, 2)
    assert len(padding) == 2 and all(m.padding and m.rows.tolist() == [3] for m in padding)


def padded_tokens(widths: list[int], prompts: list[int]) -> int:
    return len(widths) * (max(widths) + max(prompts))


def test_budget_chunks_are_the_longest_runs_within_both_limits() -> None:
    # The greedy cut characterised without its loop: order kept, every run within the limits (or one row alone),
    # and every run but the last maximal (its next row would break a limit).
    gen = torch.Generator().manual_seed(2)
    for trial in range(200):
        R = int(torch.randint(1, 40, (1,), generator=gen))
        widths = torch.randint(1, 30, (R,), generator=gen)
        prompts = torch.randint(0, 50, (R,), generator=gen)
        rows = torch.randperm(100, generator=gen)[:R]
        max_rows, max_tokens = (
            int(torch.randint(1, 12, (1,), generator=gen)),
            int(torch.randint(20, 400, (1,), generator=gen)),
        )
        chunks = budget_chunks(rows, widths, prompts, max_rows, max_tokens)
        assert torch.equal(torch.cat(chunks), rows), trial
        start = 0
        for i, chunk in enumerate(chunks):
            w, p = widths[start : start + len(chunk)].tolist(), prompts[start : start + len(chunk)].tolist()
            fits = len(chunk) <= max_rows and padded_tokens(w, p) <= max_tokens
            assert len(chunk) >= 1 and (fits or len(chunk) == 1), (trial, i)
            end = start + len(chunk)
            if i < len(chunks) - 1:  # one more row breaks a limit
                w1, p1 = w + [int(widths[end])], p + [int(prompts[end])]
                assert len(w1) > max_rows or padded_tokens(w1, p1) > max_tokens, (trial, i)
            start = end
    empty = torch.zeros(0, dtype=torch.long)
    assert budget_chunks(empty, empty, empty, 4, 100) == []  # a rank whose rows were all left out


def test_a_token_budget_cuts_long_rows_finer_and_keeps_every_row_once() -> None:
    # 4 prompts x 4 rows: prompt p has 2 + 4p tokens (left-padded to 14), row completion lengths 1..8
    P, G, Tp, T = 4, 4, 14, 8
    B = P * G
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    prompts = (2 + 4 * (torch.arange(B) // G)).clamp(max=Tp)
    attn = torch.zeros(B, Tp + T, dtype=torch.long)
    for r in range(B):
        attn[r, Tp - int(prompts[r]) : Tp + int(lengths[r])] = 1
    advantages = torch.randn(B, generator=gen)
    by_rows = plan_step(advantages, attn, T, G, P, 16, True)
    budget = 60
    by_tokens = plan_step(advantages, attn, T, G, P, 16, True, micro_batch_tokens=budget)
    assert len(by_rows[0].micro_batches) == 1 and len(by_tokens[0].micro_batches) > 1
    rows_of = lambda plan: [int(r) for m in plan[0].micro_batches for r in m.rows]  # noqa: E731
    assert rows_of(by_tokens) == rows_of(by_rows)  # the same rows in the same order, only cut differently
    for m in by_tokens[0].micro_batches:
        assert m.columns is not None
        kept = m.columns.stop - m.columns.start  # the forward's input width: longest prompt + longest completion
        assert kept == int(prompts[m.rows].max()) + m.width
        assert len(m.rows) * kept <= budget or len(m.rows) == 1


def test_trimmed_rows_give_the_same_logprobs() -> None:
    module = tiny_module()
    policy = module.policy.eval()
    gen = torch.Generator().manual_seed(1)
    b, Tp, T = 4, 7, 6
    ids = torch.randint(4, 12, (b, Tp + T), generator=gen)  # within the maze vocabulary
    attn = torch.ones(b, Tp + T, dtype=torch.long)
    prompt_lengths, completion_lengths = [3, 5, 4, 3], [2, 4, 1, 3]
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        attn[row, : Tp - p] = 0  # left-padded prompt
        attn[row, Tp + c :] = 0  # right-padded completion
    width = max(completion_lengths)
    cut_ids, cut_attn = trim_rows(ids, attn, T, width)
    assert cut_ids.shape == (b, max(prompt_lengths) + width)  # two all-padding prompt columns and two tail columns
    with torch.no_grad():
        full = completion_logprobs(policy, ids, attn, T).logp[:, :width]
        cut = completion_logprobs(policy, cut_ids, cut_attn, width).logp
    mask = attn[:, Tp : Tp + width].bool()
    torch.testing.assert_close(cut[mask], full[mask], rtol=0, atol=1e-5)
