"""The prompts' pass of the HF engine's own loop: each distinct prompt once, and their common beginning once.

A chunk's prompts usually start alike: a chat template's system message and turn markers are most of a short
question (the SmolLM2 demo's 46-token prompts share their first 30 or so). :func:`prefill` runs that common prefix
once, as one row, repeats its keys and values for the P prompts and runs only the rest of each prompt over them.
The rests are left-padded to one width, so a prompt's positions read: prefix, padding, its own tokens; the returned
mask marks the padding and the positions skip it, so each prompt sees exactly its own tokens at their own positions.
A prefix shorter than :data:`MIN_SHARED` tokens, or a single prompt, goes through as one left-padded pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicLayer

MIN_SHARED = 8
"""Shortest common prefix worth its own pass."""


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values live in a buffer with room for ``extra`` more positions.

    ``update`` writes the new positions in place and exposes the filled part as ``keys`` / ``values`` (views of
    shape (b, heads, n, head_dim)); ``DynamicLayer.update`` instead concatenates, copying the cache every step.
    """

    def __init__(self, extra: int) -> None:
        super().__init__()
        self.extra = int(extra)
        self.filled = 0

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        length = key_states.shape[-2]
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            b, h, n, d = key_states.shape
            self.key_buffer = key_states.new_empty(b, h, n + self.extra, d)  # (b, heads, L + extra, d)
            self.value_buffer = value_states.new_empty(b, value_states.shape[1], n + self.extra, value_states.shape[3])
            self.is_initialized = True
        if self.filled + length > self.key_buffer.shape[-2]:
            raise RuntimeError(f"PreallocatedLayer: {self.filled} + {length} positions exceed its buffer")
        self.key_buffer[:, :, self.filled : self.filled + length] = key_states
        self.value_buffer[:, :, self.filled : self.filled + length] = value_states
        self.filled += length
        return self._expose()

    def _expose(self) -> tuple[Tensor, Tensor]:
        self.keys = self.key_buffer[:, :, : self.filled]  # (b, heads, n, d), a view
        self.values = self.value_buffer[:, :, : self.filled]
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep (or repeat) the rows ``indices`` of the buffers."""
        if self.is_initialized:
            self.key_buffer = self.key_buffer[indices]
            self.value_buffer = self.value_buffer[indices]
            self._expose()


def left_pad(prompts: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-pad token lists into ``input_ids`` and ``attention_mask``, both (P, L), on ``device``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)  # (P, L)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)  # (P, L)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
    return ids.to(device), attn.to(device)


def common_prefix(prompts: list[list[int]]) -> int:
    """The length of the prompts' common beginning, leaving every prompt at least one token of its own."""
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


@dataclass
class Prefilled:
    """What :func:`prefill` leaves for the decoding loop."""

    cache: Cache
    """One :class:`PreallocatedLayer` per layer, P rows of the mask's width (plus the ``extra`` room asked for)."""
    mask: Tensor
    """(P, W) 1 at prompt tokens, 0 at padding."""
    next_positions: Tensor
    """(P,) the position of each prompt's first completion token (its length)."""
    logits: Tensor
    """(P, V) the logits after each prompt's last token."""


def prefill(model: nn.Module, prompts: list[list[int]], pad_token_id: int, layers: int, extra: int) -> Prefilled:
    """Run the P prompts through ``model`` into a fresh cache, their common prefix once (see the module doc).

    Args:
        model: an HF causal LM with a plain full-attention cache, in eval mode.
        prompts: P non-empty token lists.
        pad_token_id: fills the padding (masked out).
        layers: the model's cache layers.
        extra: positions to leave free in each layer's buffer after the prompts.
    """
    device = next(model.parameters()).device
    shared = common_prefix(prompts) if len(prompts) > 1 else 0
    if shared < MIN_SHARED:
        shared = 0
    rests = [p[shared:] for p in prompts]
    ids, rest_mask = left_pad(rests, pad_token_id, device)  # (P, W')
    cache = Cache(layers=[PreallocatedLayer(extra=extra + (ids.shape[1] if shared else 0)) for _ in range(layers)])
    if shared:
        head = torch.tensor([prompts[0][:shared]], device=device)  # (1, S)
        positions = torch.arange(shared, device=device)[None]  # (1, S)
        model(input_ids=head, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long, device=device))  # (P, kv, S, d)
    head_mask = torch.ones((len(prompts), shared), dtype=rest_mask.dtype, device=device)  # (P, S)
    mask = torch.cat([head_mask, rest_mask], dim=1)  # (P, S + W')
    positions = shared + (rest_mask.cumsum(dim=1) - 1).clamp(min=0)  # (P, W'): padding does not shift positions
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
        logits_to_keep=1,
    )  # fmt: skip
    return Prefilled(cache=cache, mask=mask, next_positions=positions[:, -1] + 1, logits=out.logits[:, -1])


__all__ = ["MIN_SHARED", "Prefilled", "PreallocatedLayer", "common_prefix", "left_pad", "prefill"]
