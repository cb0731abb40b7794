"""The shared-prompt forward equals whole rows through the decoder, in value, entropy and gradient.

Reference: ``completion_logprobs(share_prompts=False)`` (every row whole) and the plain full-logits path
(``chunked=False``). Batches are GRPO-shaped (each prompt G times, left-padded to different lengths, ragged
completions) with the rows shuffled, as the length-sorted micro-batches of the training step leave them.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.models.logprobs import completion_logprobs, split_output_layer
from lit_fgrpo.models.prompt_sharing import MAX_BUCKETS, length_buckets, shared_prompt_hidden
from tests.models.test_logprobs import grads, relative_errors
from tests.tiny_models import tiny_lm

VOCAB = 1000


def group_batch(P: int = 3, G: int = 4, Tp: int = 7, T: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """(P * G, Tp + T) ids and mask: prompt i left-padded by i tokens, completions of 1..T tokens, rows shuffled."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, VOCAB, (P, Tp), generator=g)  # (P, Tp)
    prompt_mask = (torch.arange(Tp)[None, :] >= torch.arange(P)[:, None]).long()  # (P, Tp)
    prompt = prompt * prompt_mask  # pad id 0 on the left
    ids = torch.cat([prompt.repeat_interleave(G, 0), torch.randint(3, VOCAB, (P * G, T), generator=g)], dim=1)
    lengths = torch.randint(1, T + 1, (P * G,), generator=g)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), (torch.arange(T)[None, :] < lengths[:, None]).long()], 1)
    ids = ids * mask
    order = torch.randperm(P * G, generator=g)
    return ids[order], mask[order]


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Whole-row positions, as ``completion_logprobs`` computes them: (B, L)."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def run(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, T: int, **kwargs: Any) -> tuple[Any, Any, Any]:
    """(logp, entropy, grads) of a weighted sum of the log-probs."""
    model.zero_grad(set_to_none=True)
    out = completion_logprobs(model, ids, mask, T, temperature=0.8, with_entropy=True, **kwargs)
    weights = torch.linspace(-1.0, 2.0, out.logp.numel()).view_as(out.logp) * mask[:, -T:]  # (B, T)
    (out.logp * weights).sum().backward()
    return out.logp.detach() * mask[:, -T:], out.entropy * mask[:, -T:], grads(model)


def assert_as_exact_as_whole_rows(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, got: dict[str, Any], whole: dict[str, Any]
) -> None:
    """The shared path's float32 gradients are as close to the float64 whole-row gradients as the float32
    whole-row pass's: each parameter's worst error over its largest exact entry at most 4x the whole-row pass's
    worst, with a floor of 1e-4 (as in tests/models/test_logprobs.py). Two float32 paths that sum in different orders
    differ by up to about 2 x 2.6e-5 of the largest entry here (measured), so comparing them to each other at
    1e-5 fails on rounding alone; a real error (a detached cache, a wrong row) is of order 1."""
    exact64 = copy.deepcopy(model).double()
    exact = run(exact64, ids, mask, 6, share_prompts=False)[2]
    assert got.keys() == exact.keys() == whole.keys() and len(exact) > 0
    whole_error = max(relative_errors(whole, exact).values())
    bound = max(4 * whole_error, 1e-4)
    errors = relative_errors(got, exact)
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= bound, f"{worst}: {errors[worst]:.2e} from float64, bound {bound:.2e}"


def decoder_rows(model: nn.Module) -> list[tuple[int, int]]:
    """Records (rows, columns) of every decoder call (a hook on the input embeddings)."""
    calls: list[tuple[int, int]] = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    return calls


@pytest.mark.parametrize("tied", [True, False])
def test_shared_prompts_equal_whole_rows(tied: bool) -> None:
    model = tiny_lm(vocab=VOCAB, tied=tied).train()
    ids, mask = group_batch()
    calls = decoder_rows(model)
    lp, ent, g = run(model, ids, mask, 6)
    # 3 distinct prompts once, then the completions over their cache in length groups, each cut to its longest
    # row; a row of one token needs no completion pass (the prompt's last position predicts it)
    lengths = mask[:, 7:].sum(1)  # (12,)
    assert calls[0] == (3, 7) and 1 < len(calls) <= 1 + MAX_BUCKETS
    assert int((lengths > 1).sum()) <= sum(n for n, _ in calls[1:]) <= 12
    assert sum(n * w for n, w in calls[1:]) < 12 * 5  # less decoder work than one pass over the padded completions
    calls.clear()
    lp_w, ent_w, g_w = run(model, ids, mask, 6, share_prompts=False)
    assert calls == [(12, 13)]
    lp_p, _, g_p = run(model, ids, mask, 6, chunked=False)  # the model's own forward, full logits
    for ref_lp, ref_g in ((lp_w, g_w), (lp_p, g_p)):
        torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
        assert g.keys() == ref_g.keys() and len(g) > 0
    assert_as_exact_as_whole_rows(model, ids, mask, g, g_w)
    torch.testing.assert_close(ent, ent_w, rtol=1e-5, atol=1e-5)


def test_row_chunks_share_within_each_chunk() -> None:
    model = tiny_lm(vocab=VOCAB).train()
    ids, mask = group_batch()
    calls = decoder_rows(model)
    lp, _, g = run(model, ids, mask, 6, chunk_rows=5)
    prompts_of = [len({tuple(r) for r in ids[i : i + 5, :7].tolist()}) for i in range(0, 12, 5)]  # distinct per chunk
    want = [(u, 7) if u < n else (n, 13) for u, n in zip(prompts_of, (5, 5, 2))]  # prompt pass, or whole rows
    assert [call for call in calls if call[1] >= 7] == want and any(w[1] == 7 for w in want)
    lp_w, _, g_w = run(model, ids, mask, 6, share_prompts=False)
    torch.testing.assert_close(lp, lp_w, rtol=1e-5, atol=1e-5)
    assert_as_exact_as_whole_rows(model, ids, mask, g, g_w)


def test_lora_adapters_apply_on_the_shared_path() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_lm(vocab=VOCAB, tied=False),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    ids, mask = group_batch()
    lp, _, g = run(model, ids, mask, 6)
    lp_w, _, g_w = run(model, ids, mask, 6, share_prompts=False)
    torch.testing.assert_close(lp, lp_w, rtol=1e-5, atol=1e-5)
    assert any("lora" in name for name in g)
    assert_as_exact_as_whole_rows(model, ids, mask, g, g_w)


def test_nothing_is_shared_where_it_cannot_be() -> None:
    model = tiny_lm(vocab=VOCAB)
    split = split_output_layer(model)
    assert split is not None
    decoder = split[0]
    ids, mask = group_batch(P=4, G=1)
    assert shared_prompt_hidden(decoder, ids, mask, positions(mask), 6) is None  # every prompt distinct
    ids, mask = group_batch()
    assert shared_prompt_hidden(decoder, ids, mask, positions(mask), 13) is None  # no prompt column
    model.gradient_checkpointing_enable()
    model.train()
    assert shared_prompt_hidden(decoder, ids, mask, positions(mask), 6) is None  # transformers would drop the cache
    model.eval()
    assert shared_prompt_hidden(decoder, ids, mask, positions(mask), 6) is not None  # no checkpointing outside training


def test_gradients_are_the_same_on_every_run_with_two_threads() -> None:
    """Many rows share few prompts: the prompt gradients sum the rows in a fixed order (index_select's backward).

    With ``tensor[rows]`` (transformers' ``batch_select_indices``) the CPU backward's accumulating ``index_put_``
    adds from 2 threads in a varying order: repeated runs then differ in the last bits (and 200 RL steps later in
    the maze demo's pass@k).
    """
    model = tiny_lm(vocab=VOCAB).train()
    ids, mask = group_batch(P=2, G=48, Tp=24, T=6)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [run(model, ids, mask, 6)[2] for _ in range(8)]
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for name, grad in runs[0].items():
            assert torch.equal(other[name], grad), name


def brute_force_cost(extents: list[int], groups: int) -> int:
    """Least decoder positions over every assignment of the rows to at most ``groups`` groups (no ordering
    assumed): a group of n rows led by extent w costs n * (w - 1)."""
    best = None
    for labels in itertools.product(range(groups), repeat=len(extents)):
        cost = 0
        for k in range(groups):
            members = [e for e, label in zip(extents, labels) if label == k]
            if members:
                cost += len(members) * max(max(members) - 1, 0)
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(6))
def test_length_buckets_are_the_cheapest_split(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    extents = torch.randint(0, 12, (7,), generator=g).tolist()
    for most in (1, 2, 3):
        groups = length_buckets(extents, max_buckets=most)
        assert sorted(r for grp in groups for r in grp) == list(range(7)) and len(groups) <= most
        cost = sum(len(grp) * max(max(extents[r] for r in grp) - 1, 0) for grp in groups)
        one = 7 * max(max(extents) - 1, 0)
        # the cheapest split, up to the 5 % per extra group it must save
        assert cost <= brute_force_cost(extents, most) + (len(groups) - 1) * 0.05 * one + 1e-9
        assert cost + (len(groups) - 1) * 0.05 * one <= one + 1e-9
