"""ΔNLL_rare and the length-normalised completion NLL against plain Python loops."""

from __future__ import annotations

import math

import pytest
import torch

from lit_fgrpo.theory.dnll_rare import delta_nll_rare, rare_indices, sequence_nll


def dumb_delta_nll_rare(base: list[float], trained: list[float], top_fraction: float) -> float:
    order = sorted(range(len(base)), key=lambda i: base[i], reverse=True)
    k = max(1, math.ceil(top_fraction * len(base)))
    chosen = order[:k]
    return sum(trained[i] - base[i] for i in chosen) / len(chosen)


@pytest.mark.parametrize("top_fraction", [0.01, 0.05, 0.3, 1.0])
def test_delta_nll_rare_matches_loop(top_fraction: float) -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(1000, generator=gen) * 3  # (M,)
    trained = base + torch.randn(1000, generator=gen)  # (M,)
    expected = dumb_delta_nll_rare(base.tolist(), trained.tolist(), top_fraction)
    assert delta_nll_rare(base, trained, top_fraction) == pytest.approx(expected, rel=1e-6)


def test_delta_nll_rare_correct_mask_and_edge_cases() -> None:
    base = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])  # (M,)
    trained = torch.tensor([0.0, 1.5, 6.0, 2.0, 3.5])  # (M,)
    correct = torch.tensor([False, True, True, True, True])  # (M,)
    # the incorrect row (base 5.0) is ignored; the rarest correct one is base 4.0 -> trained 6.0
    assert delta_nll_rare(base, trained, 0.01, correct=correct) == pytest.approx(2.0)
    assert delta_nll_rare(base, trained, 0.5, correct=correct) == pytest.approx((2.0 + 0.5) / 2)
    assert rare_indices(base, 0.4).tolist() == [0, 2]
    with pytest.raises(ValueError):
        delta_nll_rare(base, trained[:3])
    with pytest.raises(ValueError):
        delta_nll_rare(base, trained, top_fraction=0.0)


def tiny_causal_lm() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config).eval()


def test_sequence_nll_matches_token_loop() -> None:
    model = tiny_causal_lm()
    gen = torch.Generator().manual_seed(1)
    lengths, prompt_lens = [9, 6, 12, 4, 7], [3, 2, 5, 1, 4]
    batch, width = len(lengths), max(lengths)
    input_ids = torch.zeros(batch, width, dtype=torch.long)  # (B, T) right-padded with id 0
    attention_mask = torch.zeros(batch, width, dtype=torch.long)  # (B, T)
    completion_mask = torch.zeros(batch, width, dtype=torch.long)  # (B, T)
    for b, (n, p) in enumerate(zip(lengths, prompt_lens)):
        input_ids[b, :n] = torch.randint(1, 40, (n,), generator=gen)
        attention_mask[b, :n] = 1
        completion_mask[b, p:n] = 1

    got = sequence_nll(model, input_ids, attention_mask, completion_mask, batch_size=2)  # (B,)

    expected = []
    with torch.no_grad():
        for b, (n, p) in enumerate(zip(lengths, prompt_lens)):
            ids = input_ids[b : b + 1, :n]  # (1, n) unpadded row on its own
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (n, V)
            terms = [-float(logp[t - 1, ids[0, t]]) for t in range(p, n)]
            expected.append(sum(terms) / len(terms))
    assert got.shape == (batch,)
    assert not got.requires_grad
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=1e-5)
