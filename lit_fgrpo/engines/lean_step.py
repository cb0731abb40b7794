"""The HF engine's lean decoding step: the decoder layers as a dozen tensor operations each, over a shared-prompt cache.

HF's forward, called once per decoding step for R rows, builds a 4-D attention mask, repeats every key and value
head ``heads / kv_heads`` times (a copy of the whole cache per layer and step), and its KV cache holds each prompt
once per sample. This step computes the same layer (RMSNorm, q/k/v projections, rotary embedding, attention, output
projection, SiLU-gated MLP) from :class:`~lit_fgrpo.engines.lean_weights.LeanWeights`, with:

- the prompt's keys and values stored once per prompt, (P, kv_heads, L, d), as HF's prefill left them;
- each row's own completion keys and values in a buffer of ``max_tokens`` positions, written in place;
- grouped-query attention without copying heads: the ``heads / kv_heads`` queries of a key head attend together;
  the rows of a prompt are laid out on a (P, kv_heads, G·g) grid for the prompt part, one matmul per prompt;
- one softmax over [prompt positions, own positions] per row, left padding masked.

Rows that stop leave the batch (:meth:`SharedPromptCache.keep`); nothing is copied: the prompt part never held them,
and their own few positions stay in the buffer, where a small matmul over every row is cheaper than moving it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_fgrpo.engines.lean_weights import LeanWeights, rms_norm, rotate_half


class SharedPromptCache:
    """Keys and values of P prompts (shared by their rows) and of each row's completion so far.

    Args:
        prompt_keys: per layer, (P, kv_heads, L, d): the prefill's keys (after the rotary embedding).
        prompt_values: per layer, (P, kv_heads, L, d).
        prompt_mask: (P, L), 1 at prompt tokens, 0 at left padding.
        row_prompt: (R,) the prompt of each row.
        max_tokens: completion positions to hold per row.
    """

    def __init__(
        self, prompt_keys: list[Tensor], prompt_values: list[Tensor], prompt_mask: Tensor, row_prompt: Tensor,
        max_tokens: int,
    ) -> None:  # fmt: skip
        self.prompt_keys, self.prompt_values = prompt_keys, prompt_values
        num_prompts, kv_heads, _, head_dim = prompt_keys[0].shape
        rows = row_prompt.shape[0]
        counts = torch.bincount(row_prompt, minlength=num_prompts)  # (P,)
        self.group = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts  # (P,) rows are prompt-major: a prompt's rows are contiguous
        self.row_prompt = row_prompt  # (R',)
        self.row_slot = torch.arange(rows, device=row_prompt.device) - starts[row_prompt]  # (R',) place in its group
        bias = torch.zeros(prompt_mask.shape, dtype=prompt_keys[0].dtype, device=row_prompt.device)  # (P, L)
        self.prompt_bias = bias.masked_fill(prompt_mask == 0, float("-inf"))
        self.row_bias = self.prompt_bias[row_prompt][:, None, None]  # (R', 1, 1, L)
        shape = (len(prompt_keys), rows, kv_heads, max_tokens, head_dim)
        self.own_keys = prompt_keys[0].new_empty(shape)  # (layers, R', kv_heads, T, d)
        self.own_values = prompt_keys[0].new_empty(shape)
        self.filled = 0
        self.live: Tensor | None = None
        """(R',) the buffers' rows still decoding; None = all."""

    def write(self, layer: int, keys: Tensor, values: Tensor) -> None:
        """Store the current step's (R', kv_heads, d) keys and values of ``layer`` at position ``filled``."""
        if self.live is None:
            self.own_keys[layer, :, :, self.filled] = keys
            self.own_values[layer, :, :, self.filled] = values
        else:
            self.own_keys[layer, self.live, :, self.filled] = keys
            self.own_values[layer, self.live, :, self.filled] = values

    def advance(self) -> None:
        """After every layer has written the step: one more own position is filled."""
        self.filled += 1

    def _shared_scores(self, layer: int, q: Tensor) -> Tensor:
        """(R', kv, g, d) queries against their prompt's keys: (R', kv, g, L), one matmul per prompt."""
        prompts, kv_heads, length, head_dim = self.prompt_keys[layer].shape
        g = q.shape[2]
        grid = q.new_zeros(prompts, kv_heads, self.group, g, head_dim)  # (P, kv, G, g, d)
        grid[self.row_prompt, :, self.row_slot] = q
        flat = grid.view(prompts, kv_heads, self.group * g, head_dim)  # (P, kv, G·g, d)
        scores = flat @ self.prompt_keys[layer].transpose(-1, -2)  # (P, kv, G·g, L)
        return scores.view(prompts, kv_heads, self.group, g, length)[self.row_prompt, :, self.row_slot]

    def _shared_values(self, layer: int, probs: Tensor) -> Tensor:
        """(R', kv, g, L) attention weights over their prompt's positions -> (R', kv, g, d)."""
        prompts, kv_heads, length, head_dim = self.prompt_values[layer].shape
        g = probs.shape[2]
        grid = probs.new_zeros(prompts, kv_heads, self.group, g, length)  # (P, kv, G, g, L)
        grid[self.row_prompt, :, self.row_slot] = probs
        out = grid.view(prompts, kv_heads, self.group * g, length) @ self.prompt_values[layer]  # (P, kv, G·g, d)
        return out.view(prompts, kv_heads, self.group, g, head_dim)[self.row_prompt, :, self.row_slot]

    def _own(self, batch: Tensor, other: Tensor) -> Tensor:
        """``batch @ other`` over every row of the buffers (finished rows too: cheaper than moving the buffers),
        for the live rows: (R', kv, g, x) -> (R', kv, g, y)."""
        if self.live is None:
            return batch @ other
        full = batch.new_zeros(other.shape[0], *batch.shape[1:])  # (R, kv, g, x)
        full[self.live] = batch
        return (full @ other)[self.live]

    def attend(self, layer: int, queries: Tensor) -> Tensor:
        """Attention of (R', heads, d) scaled queries over the prompt and the row's own positions (the current one
        written); returns (R', heads · d)."""
        rows, heads, head_dim = queries.shape
        kv_heads, length = self.prompt_keys[layer].shape[1:3]
        q = queries.view(rows, kv_heads, heads // kv_heads, head_dim)  # (R', kv, g, d)
        own_k = self.own_keys[layer, :, :, : self.filled + 1]  # (R, kv, t, d)
        own = self._own(q, own_k.transpose(-1, -2))  # (R', kv, g, t)
        shared = self._shared_scores(layer, q) + self.row_bias  # (R', kv, g, L)
        probs = torch.softmax(torch.cat([shared, own], dim=-1), dim=-1)  # (R', kv, g, L + t)
        out = self._shared_values(layer, probs[..., :length])  # (R', kv, g, d)
        out = out + self._own(probs[..., length:], self.own_values[layer, :, :, : self.filled + 1])
        return out.reshape(rows, heads * head_dim)

    def keep(self, rows: Tensor) -> None:
        """Keep only the rows ``rows`` (increasing indices into the current rows). Their own keys and values stay
        where they are in the buffers (moving them cost more than attending over the finished rows' few)."""
        self.live = rows if self.live is None else self.live[rows]  # (R',) rows of the buffers
        self.row_prompt, self.row_slot = self.row_prompt[rows], self.row_slot[rows]
        self.row_bias = self.row_bias[rows]


def decode_step(weights: LeanWeights, cache: SharedPromptCache, tokens: Tensor, positions: Tensor) -> Tensor:
    """One decoding step of R' rows: (R',) tokens at (R',) positions -> (R', V) logits; the cache gains the step.

    Layer by layer what HF's Llama / Qwen2 / Qwen3 decoder layer computes for one new position.
    """
    w = weights
    x = w.embed(tokens)  # (R', H)
    rows = x.shape[0]
    cos, sin = w.rotary(x, positions[:, None])  # (R', 1, d) each
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.input_norm, w.eps)  # (R', H)
        q_out, k_out, v_out = (layer.q(h), layer.k(h), layer.v(h)) if layer.qkv is None else layer.qkv(h)
        q = q_out.view(rows, w.heads, w.head_dim)  # (R', heads, d)
        k = k_out.view(rows, w.kv_heads, w.head_dim)  # (R', kv, d)
        v = v_out.view(rows, w.kv_heads, w.head_dim)  # (R', kv, d)
        if layer.q_norm is not None and layer.k_norm is not None:
            q, k = rms_norm(q, layer.q_norm, w.eps), rms_norm(k, layer.k_norm, w.eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache.write(i, k, v)
        x = x + layer.o(cache.attend(i, q * w.scaling))  # (R', H)
        h = rms_norm(x, layer.post_norm, w.eps)
        gate, up = (layer.gate(h), layer.up(h)) if layer.gate_up is None else layer.gate_up(h)  # (R', I) each
        x = x + layer.down(F.silu(gate) * up)  # (R', H)
    cache.advance()
    return w.head(rms_norm(x, w.final_norm, w.eps))  # (R', V)


__all__ = ["SharedPromptCache", "decode_step"]
