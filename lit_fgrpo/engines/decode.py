"""The HF engine's own sampling loop: one prefill per prompt, a preallocated KV cache, finished rows dropped.

``model.generate`` with ``n`` samples per prompt prefills every one of the ``P * n`` rows (the same prompt ``n``
times), grows its KV cache by concatenation (every step copies the whole cache: O(T^2) bytes per row), and runs
finished rows to the end. This loop calls the model's own forward, so the numbers are the model's, but:

- prefills each prompt once, ``P`` rows, then repeats its KV cache and last logits ``n`` times;
- writes each step's keys and values into a buffer sized for the prompt plus ``max_tokens`` (no copy);
- drops rows from the batch (cache, attention mask, positions) once they have sampled a stop token.

A row's tokens are the same as through ``generate``, up to float rounding of the batched matmuls: the same
:class:`~lit_fgrpo.engines.row_sampling.RowSampler` draws step ``t`` of row ``r`` from ``(seed_r, t)`` whatever
the batch holds. Measured on the case-a shape of ``benchmarks/bench_step.py`` (64 rows x 64 tokens, 1 thread):
0.27 s through ``generate``, 0.19 s here (docs/RESULTS.md, section 7.2).

Only causal LMs whose every layer caches full attention take this loop (:func:`supports_own_loop`); sliding-window
or hybrid caches (Mistral's default 4,096 window, Gemma 2/3, linear-attention hybrids) stay on ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicLayer

from lit_fgrpo.engines.row_sampling import RowSampler


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


def full_attention_layers(model: nn.Module) -> int | None:
    """The number of cache layers when every layer caches full attention, else None (then use ``generate``)."""
    wrapper: Any = model
    base: Any = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper  # PEFT -> HF model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or not hasattr(config, "get_text_config"):
        return None
    text = config.get_text_config(decoder=True)
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int):
        return None
    types = getattr(text, "layer_types", None)
    if types is not None:
        return layers if list(types) == ["full_attention"] * layers else None
    if any(getattr(text, name, None) is not None for name in ("sliding_window", "attention_chunk_size")):
        return None
    return layers


def supports_own_loop(model: nn.Module) -> bool:
    """Whether :func:`sample_rows` can run ``model``: an HF causal LM with a plain full-attention KV cache."""
    return full_attention_layers(model) is not None


@dataclass
class Sampled:
    """What :func:`sample_rows` returns, row-major as the rows were given."""

    tokens: list[list[int]]
    """Each row's completion, up to and including its first stop token."""
    logprobs: list[list[float]]
    """The sampling log-probs of those tokens."""
    finished: list[bool]
    """Whether the row ended on a stop token (else it ran to ``max_tokens``)."""


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


@torch.no_grad()
def sample_rows(
    model: nn.Module,
    prompts: list[list[int]],
    row_prompt: list[int],
    sampler: RowSampler,
    max_tokens: int,
    stop_ids: set[int],
    pad_token_id: int,
) -> Sampled:
    """Sample one completion per row; row ``r`` continues ``prompts[row_prompt[r]]`` with ``sampler``'s seed ``r``.

    Args:
        model: an HF causal LM for which :func:`supports_own_loop` holds (in eval mode: the caller's job).
        prompts: the distinct prompts (token ids, each non-empty).
        row_prompt: for each of the R rows, the index of its prompt.
        sampler: draws the rows' tokens (its seeds are indexed by row).
        max_tokens: most tokens per completion.
        stop_ids: a row ends after sampling one of these.
        pad_token_id: fills the left padding of shorter prompts (masked out).
    """
    if max_tokens < 1 or not row_prompt:
        return Sampled(
            tokens=[[] for _ in row_prompt], logprobs=[[] for _ in row_prompt], finished=[False] * len(row_prompt)
        )
    layers = full_attention_layers(model)
    if layers is None:
        raise ValueError(f"sample_rows: {type(model).__name__} has no plain full-attention cache; use generate")
    device = next(model.parameters()).device
    ids, attn = left_pad(prompts, pad_token_id, device)  # (P, L)
    L = ids.shape[1]
    cache = Cache(layers=[PreallocatedLayer(extra=max_tokens) for _ in range(layers)])
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)  # (P, L): left padding does not shift RoPE positions
    out = model(
        input_ids=ids, attention_mask=attn, position_ids=positions, past_key_values=cache, use_cache=True,
        logits_to_keep=1,
    )  # fmt: skip
    expand = torch.tensor(row_prompt, dtype=torch.long, device=device)  # (R,)
    cache.batch_select_indices(expand)
    logits = out.logits[:, -1][expand]  # (R, V)
    mask = torch.ones((len(row_prompt), L + max_tokens), dtype=torch.long, device=device)  # (R, L + T)
    mask[:, :L] = attn[expand]
    next_pos = positions[expand, -1] + 1  # (R,)
    active = torch.arange(len(row_prompt), device=device)  # (R',) rows still sampling
    tokens = torch.full((len(row_prompt), max_tokens), pad_token_id, dtype=torch.long, device=device)  # (R, T)
    logps = torch.zeros((len(row_prompt), max_tokens), dtype=torch.float32, device=device)  # (R, T)
    lengths = torch.full((len(row_prompt),), max_tokens, dtype=torch.long, device=device)  # (R,)
    stopped = torch.zeros(len(row_prompt), dtype=torch.bool, device=device)  # (R,) ended on a stop token
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    for step in range(max_tokens):
        new, logp = sampler.draw(logits, step, active)  # (R',), (R',)
        tokens[active, step] = new
        logps[active, step] = logp
        done = torch.isin(new, stops)  # (R',)
        if bool(done.any()):
            lengths[active[done]] = step + 1
            stopped[active[done]] = True
            keep = (~done).nonzero().squeeze(-1)  # (R'',) positions in the active batch
            if keep.numel() == 0:
                break
            active, new, next_pos = active[keep], new[keep], next_pos[keep]
            mask = mask[keep]
            cache.batch_select_indices(keep)
        if step + 1 == max_tokens:
            break
        out = model(
            input_ids=new.unsqueeze(-1), attention_mask=mask[:, : L + step + 1], position_ids=next_pos.unsqueeze(-1),
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        logits = out.logits[:, -1]  # (R', V)
        next_pos = next_pos + 1
    tokens_cpu, logps_cpu, lengths_cpu = tokens.cpu(), logps.cpu(), lengths.cpu().tolist()
    return Sampled(
        tokens=[tokens_cpu[r, :n].tolist() for r, n in enumerate(lengths_cpu)],
        logprobs=[logps_cpu[r, :n].tolist() for r, n in enumerate(lengths_cpu)],
        finished=stopped.cpu().tolist(),
    )


__all__ = ["PreallocatedLayer", "Sampled", "full_attention_layers", "left_pad", "sample_rows", "supports_own_loop"]
