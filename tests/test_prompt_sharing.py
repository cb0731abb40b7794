"""The shared-prompt forward equals whole rows through the decoder, in value, entropy and gradient.

Reference: ``completion_logprobs(share_prompts=False)`` (every row whole) and the plain full-logits path
(``chunked=False``). Batches are GRPO-shaped (each prompt G times, left-padded to different lengths, ragged
completions) with the rows shuffled, as the length-sorted micro-batches of the training step leave them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.models.logprobs import completion_logprobs, split_output_layer
from lit_fgrpo.models.prompt_sharing import shared_prompt_hidden
from tests.test_logprobs import assert_grads_close, grads, tiny_lm

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
    assert calls == [(3, 7), (12, 6)]  # 3 distinct prompts once, then the 12 completions over their cache
    calls.clear()
    lp_w, ent_w, g_w = run(model, ids, mask, 6, share_prompts=False)
    assert calls == [(12, 13)]
    lp_p, _, g_p = run(model, ids, mask, 6, chunked=False)  # the model's own forward, full logits
    for ref_lp, ref_g in ((lp_w, g_w), (lp_p, g_p)):
        torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
        assert g.keys() == ref_g.keys() and len(g) > 0
        assert_grads_close(g, ref_g)
    torch.testing.assert_close(ent, ent_w, rtol=1e-5, atol=1e-5)


def test_row_chunks_share_within_each_chunk() -> None:
    model = tiny_lm(vocab=VOCAB).train()
    ids, mask = group_batch()
    calls = decoder_rows(model)
    lp, _, g = run(model, ids, mask, 6, chunk_rows=5)
    prompts_of = [len({tuple(r) for r in ids[i : i + 5, :7].tolist()}) for i in range(0, 12, 5)]  # distinct per chunk
    want = [[(u, 7), (n, 6)] if u < n else [(n, 13)] for u, n in zip(prompts_of, (5, 5, 2))]
    assert calls == [call for pair in want for call in pair] and any(len(w) == 2 for w in want)
    lp_w, _, g_w = run(model, ids, mask, 6, share_prompts=False)
    torch.testing.assert_close(lp, lp_w, rtol=1e-5, atol=1e-5)
    assert_grads_close(g, g_w)


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
    assert_grads_close(g, g_w)


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
