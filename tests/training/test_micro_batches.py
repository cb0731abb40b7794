"""plan_micro_batches and trim_rows against loops: every contributing row once, sorted, widths, unchanged log-probs."""

from __future__ import annotations

import torch

from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.training.micro_batches import padding_micro_batches, plan_micro_batches, trim_rows
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
