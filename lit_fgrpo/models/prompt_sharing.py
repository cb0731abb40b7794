"""Each distinct prompt through the decoder once: the G completions of a group attend to one cached copy of it.

A GRPO batch holds every prompt G times. Teacher forcing all B = P * G rows whole runs the decoder over the
prompt G times, with the same result each time (causal attention: a prompt position never sees the completion).
Here the decoder runs over the U distinct prompts of a row chunk once, with a KV cache; the cache (and each
prompt's last hidden state, which predicts the first completion token) is indexed out to the b rows, and the
decoder then runs over the completions only, attending to the cached prompt keys and values. Indexing is
differentiable, so under autograd each prompt position's gradient is the sum over its rows, as in the whole-row
pass: the values and the gradient are the same up to float rounding (tests/models/test_prompt_sharing.py).

The indexing is ``index_select``, not ``tensor[rows]`` (what transformers' ``batch_select_indices`` does): the
backward of ``tensor[rows]`` on the CPU is an accumulating ``index_put_`` whose threads add into the shared prompt
rows in whatever order they get there, so with 2 threads two runs of the same training differed in the last bits
(and, 200 RL steps later, in the demo's pass@k). ``index_select``'s backward (``index_add_``) adds in a fixed order.

Cost: the prompt's share of the decoder's work falls by a factor of b / U (G within one micro-batch of whole
groups). Measured on the case-a shape of ``benchmarks/bench_step.py`` (8 prompts x 8 completions, 32 + 64
tokens, 1 thread): forward + backward 0.30 s -> 0.22 s (docs/RESULTS.md, section 7.2). Longer prompts gain more.

Completions end at different lengths, and a batch is as wide as its longest. After the prompt pass the completions
go through the decoder in up to :data:`MAX_BUCKETS` groups of rows of similar length (:func:`length_buckets`: the
cheapest split, exactly), each cut to its own longest row; only real positions are returned, so the output layer
skips the padding too. On SmolLM2-135M (``bench_step.py --cases r``: 4 x 4 replies of 10.5 of at most 16 tokens)
forward + backward went from 3.6 s to 2.1 s (docs/real-model.md).

Not used (the caller runs whole rows) where the model would drop the cache: under gradient checkpointing in train
mode transformers turns ``use_cache`` off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

MAX_BUCKETS = 4
"""Most length groups of the completion pass."""
BUCKET_GAIN = 0.05
"""Share of the one-group decoder work each further group must save."""


def _checkpointing(decoder: nn.Module) -> bool:
    """Whether transformers would run ``decoder`` without a cache (gradient checkpointing while training)."""
    if not decoder.training:
        return False
    flag: Any = getattr(decoder, "is_gradient_checkpointing", None)
    if isinstance(flag, bool):
        return flag
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


def length_buckets(extents: list[int], max_buckets: int = MAX_BUCKETS) -> list[list[int]]:
    """Rows grouped by completion extent so that each group's completion pass is cut to its own longest row.

    A group of ``n`` rows whose longest extent is ``w`` costs ``n * (w - 1)`` decoder positions (the first
    completion token is predicted by the prompt's last position). The groups are contiguous runs of the rows
    sorted by extent (longest first); among 1..``max_buckets`` groups the split minimising that cost is found
    exactly (dynamic programming), and each group beyond the first must save :data:`BUCKET_GAIN` of the one-group
    cost (a decoder call has a fixed cost too).

    Args:
        extents: (b,) each row's completion extent (last real column + 1; 0 for an empty completion).
        max_buckets: most groups.

    Returns:
        Row indices per group, longest extents first; every row in exactly one group.
    """
    if not extents:
        return []
    order = sorted(range(len(extents)), key=lambda r: -extents[r])
    width = [max(extents[r] - 1, 0) for r in order]  # decoder positions per row of a group led by this row
    n = len(order)
    # best[k][j]: least cost of the first j sorted rows in k groups; cut[k][j] where the last group starts
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(max_buckets + 1)]
    cut = [[0] * (n + 1) for _ in range(max_buckets + 1)]
    best[0][0] = 0.0
    for k in range(1, max_buckets + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):  # the last group is sorted rows i..j-1, led by row i (the longest)
                cost = best[k - 1][i] + (j - i) * width[i]
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    one = best[1][n]
    k = min(range(1, min(max_buckets, n) + 1), key=lambda k: best[k][n] + (k - 1) * BUCKET_GAIN * one)
    groups: list[list[int]] = []
    j = n
    while k:
        i = cut[k][j]
        groups.append(order[i:j])
        j, k = i, k - 1
    return groups[::-1]


def shared_prompt_hidden(
    decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, T: int
) -> Tensor | None:
    """Hidden states that predict the real completion tokens of each row, with each distinct prompt run once.

    The completions then go through the decoder in a few groups of similar length (:func:`length_buckets`),
    each cut to its own longest row, so trailing padding costs (almost) no decoder work.

    Args:
        decoder: the HF decoder (``base_model``: returns ``last_hidden_state`` and takes ``past_key_values``).
        input_ids: (b, Tp + T) left-padded prompt then right-padded completion.
        attention_mask: (b, Tp + T) 1 on real tokens.
        position_ids: (b, Tp + T) positions of the whole rows (``cumsum(mask) - 1``, as the whole-row pass uses).
        T: completion columns.

    Returns:
        (N, H) hidden states of the N real completion positions (``attention_mask[:, Tp:]`` nonzero), in row-major
        order: entry n predicts the n-th real completion token. None when nothing would be shared (every prompt
        distinct, an empty prompt column, an empty prompt, or a model that would drop the cache).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    b, width = input_ids.shape
    Tp = width - T
    if Tp < 1 or b < 2 or _checkpointing(decoder) or not bool(attention_mask[:, Tp - 1].all()):
        return None  # the last prompt column must be real in every row: it predicts the first completion token
    prompt = torch.cat([input_ids[:, :Tp], attention_mask[:, :Tp].to(input_ids.dtype)], dim=1)  # (b, 2 Tp)
    distinct, row_prompt = torch.unique(prompt, dim=0, return_inverse=True)  # (U, 2 Tp), (b,)
    if distinct.shape[0] == b:
        return None
    prompt_ids, prompt_mask = distinct[:, :Tp], distinct[:, Tp:].to(attention_mask.dtype)  # (U, Tp)
    prompt_pos = (prompt_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (U, Tp): the rows' own, per distinct prompt
    cache = DynamicCache()
    prompt_hidden = decoder(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_pos, past_key_values=cache, use_cache=True
    ).last_hidden_state[:, -1]  # (U, H): predicts the first completion token
    real = attention_mask[:, Tp:].bool()  # (b, T)
    cols = torch.arange(1, T + 1, device=real.device)  # (T,)
    extents = (real * cols).amax(dim=1).tolist() if T else [0] * b  # (b,): last real column + 1
    plain = all(type(layer) is DynamicLayer for layer in cache.layers)
    groups = length_buckets(extents) if plain else [list(range(b))]
    hidden: list[Tensor] = []
    index: list[Tensor] = []
    for group in groups:
        w = max(extents[r] for r in group)
        if w == 0:
            continue  # empty completions: nothing to predict
        rows = torch.tensor(group, device=input_ids.device)  # (n,)
        prompt_of = row_prompt.index_select(0, rows)  # (n,): each row's distinct prompt
        parts = [prompt_hidden.index_select(0, prompt_of).unsqueeze(1)]  # (n, 1, H)
        if w > 1:
            group_cache: Any = cache
            if plain:  # a new cache per group: the decoder appends the group's completion keys to it
                group_cache = copy_cache_rows(cache, prompt_of)
            else:  # one group of every row: the prompt cache itself is indexed out
                select_cache_rows(group_cache, prompt_of)
            parts.append(
                decoder(
                    input_ids=input_ids.index_select(0, rows)[:, Tp : Tp + w - 1],
                    attention_mask=attention_mask.index_select(0, rows)[:, : Tp + w - 1],
                    position_ids=position_ids.index_select(0, rows)[:, Tp : Tp + w - 1],
                    past_key_values=group_cache, use_cache=True,
                ).last_hidden_state  # (n, w - 1, H)
            )  # fmt: skip
        group_hidden = torch.cat(parts, dim=1)  # (n, w, H): position t predicts completion token t
        keep = real.index_select(0, rows)[:, :w].reshape(-1).nonzero().squeeze(1)  # (N_g,) real positions
        hidden.append(group_hidden.reshape(-1, group_hidden.shape[-1]).index_select(0, keep))  # (N_g, H)
        index.append((rows.unsqueeze(1) * T + torch.arange(w, device=rows.device)).reshape(-1).index_select(0, keep))
    H = prompt_hidden.shape[-1]
    if not hidden:
        return prompt_hidden.new_zeros(0, H)
    flat = torch.cat(index)  # (N,) row * T + t of each gathered position
    return torch.cat(hidden).index_select(0, torch.argsort(flat))  # (N, H), row-major


def copy_cache_rows(cache: Any, rows: Tensor) -> Any:
    """A new ``DynamicCache`` holding batch rows ``rows`` (repeats allowed) of every layer of ``cache`` (plain
    ``DynamicLayer`` layers), through ``index_select``: (U, heads, Tp, d) -> (n, heads, Tp, d) per layer."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), i)
    return out


def select_cache_rows(cache: Any, rows: Tensor) -> None:
    """Keep batch rows ``rows`` (repeats allowed) of every layer of a ``DynamicCache``, through ``index_select``
    (deterministic backward, see the module docstring); layers of another kind go through transformers' own
    ``batch_select_indices``."""
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if type(layer).batch_select_indices is not DynamicLayer.batch_select_indices or layer.keys is None:
            layer.batch_select_indices(rows)
        elif layer.keys.numel():
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)


__all__ = ["copy_cache_rows", "length_buckets", "select_cache_rows", "shared_prompt_hidden"]
