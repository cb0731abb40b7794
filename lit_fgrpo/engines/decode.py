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

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache

from lit_fgrpo.engines.lean_step import SharedPromptCache, decode_step
from lit_fgrpo.engines.lean_weights import LeanWeights, fusable_groups, lean_weights
from lit_fgrpo.engines.prefill import PreallocatedLayer, left_pad, prefill
from lit_fgrpo.engines.prepared_weights import PreparedWeights
from lit_fgrpo.engines.row_sampling import RowSampler


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


class _HFRows:
    """Decoding steps through the model's own forward, over a :class:`PreallocatedLayer` cache (any full-attention
    model; the rows' caches hold a copy of their prompt each)."""

    def __init__(self, model: nn.Module, cache: Cache, attn: Tensor, rows: Tensor, max_tokens: int) -> None:
        self.model, self.cache, self.width = model, cache, attn.shape[1]
        cache.batch_select_indices(rows)  # each prompt's cache repeated for its rows
        self.mask = torch.ones((rows.shape[0], self.width + max_tokens), dtype=torch.long, device=attn.device)
        self.mask[:, : self.width] = attn[rows]  # (R, L + T)

    def step(self, tokens: Tensor, positions: Tensor, step: int) -> Tensor:
        out = self.model(
            input_ids=tokens.unsqueeze(-1), attention_mask=self.mask[:, : self.width + step + 1],
            position_ids=positions.unsqueeze(-1), past_key_values=self.cache, use_cache=True,
        )  # fmt: skip
        return out.logits[:, -1]  # (R', V)

    def keep(self, rows: Tensor) -> None:
        self.mask = self.mask[rows]
        self.cache.batch_select_indices(rows)


class _LeanRows:
    """Decoding steps through :func:`~lit_fgrpo.engines.lean_step.decode_step` (one shared copy of each prompt)."""

    def __init__(self, weights: LeanWeights, cache: Cache, attn: Tensor, rows: Tensor, max_tokens: int) -> None:
        layers: list[Any] = list(cache.layers)  # PreallocatedLayer each
        keys = [layer.keys for layer in layers]  # (P, kv, L, d) each
        values = [layer.values for layer in layers]
        self.weights = weights
        self.cache = SharedPromptCache(keys, values, attn, rows, max_tokens)

    def step(self, tokens: Tensor, positions: Tensor, step: int) -> Tensor:
        return decode_step(self.weights, self.cache, tokens, positions)  # (R', V)

    def keep(self, rows: Tensor) -> None:
        self.cache.keep(rows)


@torch.no_grad()
def sample_rows(
    model: nn.Module,
    prompts: list[list[int]],
    row_prompt: list[int],
    sampler: RowSampler,
    max_tokens: int,
    stop_ids: set[int],
    pad_token_id: int,
    lean: bool = True,
    prepared: PreparedWeights | None = None,
) -> Sampled:
    """Sample one completion per row; row ``r`` continues ``prompts[row_prompt[r]]`` with ``sampler``'s seed ``r``.

    Args:
        model: an HF causal LM for which :func:`supports_own_loop` holds (in eval mode: the caller's job).
        prompts: the distinct prompts (token ids, each non-empty).
        row_prompt: for each of the R rows, the index of its prompt (rows of a prompt contiguous).
        sampler: draws the rows' tokens (its seeds are indexed by row).
        max_tokens: most tokens per completion.
        stop_ids: a row ends after sampling one of these.
        pad_token_id: fills the left padding of shorter prompts (masked out).
        lean: decode with :mod:`~lit_fgrpo.engines.lean_step` where the model allows it
            (:func:`~lit_fgrpo.engines.lean_weights.lean_weights`); False always steps through the model's forward.
        prepared: the projections multiply through these copies (packed, maybe bfloat16:
            :mod:`~lit_fgrpo.engines.prepared_weights`), in the lean step and in the model's own forward (the
            prefill, and the decoding steps when ``lean`` is off); None uses the weights as they are.
    """
    if max_tokens < 1 or not row_prompt:
        return Sampled(
            tokens=[[] for _ in row_prompt], logprobs=[[] for _ in row_prompt], finished=[False] * len(row_prompt)
        )
    layers = full_attention_layers(model)
    if layers is None:
        raise ValueError(f"sample_rows: {type(model).__name__} has no plain full-attention cache; use generate")
    groups = fusable_groups(model) if lean and prepared is not None and prepared.fuses else []
    with nullcontext() if prepared is None else prepared.swapped_into(model, groups):
        return _sample(model, prompts, row_prompt, sampler, max_tokens, stop_ids, pad_token_id, lean, prepared, layers)


def _sample(
    model: nn.Module, prompts: list[list[int]], row_prompt: list[int], sampler: RowSampler, max_tokens: int,
    stop_ids: set[int], pad_token_id: int, lean: bool, prepared: PreparedWeights | None, layers: int,
) -> Sampled:  # fmt: skip
    weights = lean_weights(model, prepared) if lean else None
    device = next(model.parameters()).device
    first = prefill(model, prompts, pad_token_id, layers, 0 if weights is not None else max_tokens)
    expand = torch.tensor(row_prompt, dtype=torch.long, device=device)  # (R,)
    decoder: _HFRows | _LeanRows
    if weights is not None:
        decoder = _LeanRows(weights, first.cache, first.mask, expand, max_tokens)
    else:
        decoder = _HFRows(model, first.cache, first.mask, expand, max_tokens)
    logits = first.logits[expand]  # (R, V)
    next_pos = first.next_positions[expand]  # (R,)
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
            decoder.keep(keep)
        if step + 1 == max_tokens:
            break
        logits = decoder.step(new, next_pos, step)  # (R', V)
        next_pos = next_pos + 1
    tokens_cpu, logps_cpu, lengths_cpu = tokens.cpu(), logps.cpu(), lengths.cpu().tolist()
    return Sampled(
        tokens=[tokens_cpu[r, :n].tolist() for r, n in enumerate(lengths_cpu)],
        logprobs=[logps_cpu[r, :n].tolist() for r, n in enumerate(lengths_cpu)],
        finished=stopped.cpu().tolist(),
    )


__all__ = ["PreallocatedLayer", "Sampled", "full_attention_layers", "left_pad", "sample_rows", "supports_own_loop"]
