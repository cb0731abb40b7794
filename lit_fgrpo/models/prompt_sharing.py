"""Each distinct prompt through the decoder once: the G completions of a group attend to one cached copy of it.

A GRPO batch holds every prompt G times. Teacher forcing all B = P * G rows whole runs the decoder over the
prompt G times, with the same result each time (causal attention: a prompt position never sees the completion).
Here the decoder runs over the U distinct prompts of a row chunk once, with a KV cache; the cache (and each
prompt's last hidden state, which predicts the first completion token) is indexed out to the b rows, and the
decoder then runs over the completions only, attending to the cached prompt keys and values. Indexing is
differentiable, so under autograd each prompt position's gradient is the sum over its rows, as in the whole-row
pass: the values and the gradient are the same up to float rounding (tests/test_prompt_sharing.py).

The indexing is ``index_select``, not ``tensor[rows]`` (what transformers' ``batch_select_indices`` does): the
backward of ``tensor[rows]`` on the CPU is an accumulating ``index_put_`` whose threads add into the shared prompt
rows in whatever order they get there, so with 2 threads two runs of the same training differed in the last bits
(and, 200 RL steps later, in the demo's pass@k). ``index_select``'s backward (``index_add_``) adds in a fixed order.

Cost: the prompt's share of the decoder's work falls by a factor of b / U (G within one micro-batch of whole
groups). Measured on the case-a shape of ``benchmarks/bench_step.py`` (8 prompts x 8 completions, 32 + 64
tokens, 1 thread): forward + backward 0.30 s -> 0.22 s (docs/RESULTS.md, section 7.2). Longer prompts gain more.

Not used (the caller runs whole rows) where the model would drop the cache: under gradient checkpointing in train
mode transformers turns ``use_cache`` off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def _checkpointing(decoder: nn.Module) -> bool:
    """Whether transformers would run ``decoder`` without a cache (gradient checkpointing while training)."""
    if not decoder.training:
        return False
    flag: Any = getattr(decoder, "is_gradient_checkpointing", None)
    if isinstance(flag, bool):
        return flag
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


def shared_prompt_hidden(
    decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, T: int
) -> Tensor | None:
    """Hidden states that predict the last ``T`` tokens of each row, with each distinct prompt run once.

    Args:
        decoder: the HF decoder (``base_model``: returns ``last_hidden_state`` and takes ``past_key_values``).
        input_ids: (b, Tp + T) left-padded prompt then right-padded completion.
        attention_mask: (b, Tp + T) 1 on real tokens.
        position_ids: (b, Tp + T) positions of the whole rows (``cumsum(mask) - 1``, as the whole-row pass uses).
        T: completion columns.

    Returns:
        (b, T, H) hidden states (position t predicts completion token t), or None when nothing would be shared
        (every prompt distinct, an empty prompt column, an empty prompt, or a model that would drop the cache).
    """
    from transformers import DynamicCache

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
    select_cache_rows(cache, row_prompt)  # every layer's (U, heads, Tp, d) -> (b, heads, Tp, d)
    completion_hidden = decoder(
        input_ids=input_ids[:, Tp:], attention_mask=attention_mask, position_ids=position_ids[:, Tp:],
        past_key_values=cache, use_cache=True,
    ).last_hidden_state  # (b, T, H)  # fmt: skip
    first = prompt_hidden.index_select(0, row_prompt).unsqueeze(1)  # (b, 1, H)
    return torch.cat([first, completion_hidden[:, :-1]], dim=1)  # (b, T, H)


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


__all__ = ["select_cache_rows", "shared_prompt_hidden"]
