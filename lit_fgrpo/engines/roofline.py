"""The decode roof of a causal LM on this machine: what generation could reach if it did nothing but its matmuls.

A decoded token costs about two FLOPs per weight it goes through, the output layer included:

.. math::
    F_{token} = 2 \\, (N_{layers} + V H),

with ``N_layers`` the parameters of the decoder layers and the final norm (the input embedding is a lookup) and
``V H`` the output layer (tied or not). Attention over the cache adds ``4 H_{attn} n`` per layer for ``n`` cached
positions, under 2 % at SmolLM2's 60 positions, and is left out. The roof is the machine's matmul rate on the model's
own shapes at a decoding batch of ``rows`` rows, measured here with torch (:func:`matmul_peak`), over that cost:
``roof = peak / F_token`` tokens a second. ``benchmarks/bench_generation.py`` prints each engine's share of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class DecodeShapes:
    """The matmuls of one decoded token: (in, out) per layer and the output layer's."""

    hidden: int
    layer_matmuls: tuple[tuple[int, int], ...]
    """(in, out) of q, k, v, o, gate, up and down."""
    layers: int
    vocab: int
    layer_params: int
    """Parameters of the decoder layers and the final norm (everything but the embedding and the output layer)."""

    @property
    def flops_per_token(self) -> int:
        """``2 (N_layers + V H)``."""
        return 2 * (self.layer_params + self.vocab * self.hidden)


def decode_shapes(model: nn.Module) -> DecodeShapes:
    """The shapes of ``model``'s decoding matmuls, from its config and its parameters (a PEFT wrapper counts its
    base model only: adapters are a few per mille)."""
    wrapper: Any = model
    base: Any = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper
    cfg = base.config.get_text_config(decoder=True)
    hidden, heads, kv = int(cfg.hidden_size), int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    inter = int(cfg.intermediate_size)
    matmuls = (
        (hidden, heads * head_dim), (hidden, kv * head_dim), (hidden, kv * head_dim), (heads * head_dim, hidden),
        (hidden, inter), (hidden, inter), (inter, hidden),
    )  # fmt: skip
    skip = {id(base.get_input_embeddings().weight), id(base.get_output_embeddings().weight)}
    layer_params = sum(p.numel() for n, p in base.named_parameters() if id(p) not in skip and "lora_" not in n)
    return DecodeShapes(hidden, matmuls, int(cfg.num_hidden_layers), int(cfg.vocab_size), layer_params)


def _seconds(a: torch.Tensor, b: torch.Tensor, budget: float) -> float:
    """The fastest of the timings of ``a @ b.T`` repeated for ``budget`` seconds."""
    a @ b.T  # first-call allocations
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < budget:
        t = time.perf_counter()
        a @ b.T
        best = min(best, time.perf_counter() - t)
    return best


def matmul_peak(
    shapes: DecodeShapes, rows: int = 512, budget: float = 0.3, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOP/s of one decoded token's matmuls at a batch of ``rows`` rows (each shape's best time, weighted by
    how often a token runs it), with torch's current thread count."""
    flops = seconds = 0.0
    todo = [(n_in, n_out, shapes.layers) for n_in, n_out in shapes.layer_matmuls] + [(shapes.hidden, shapes.vocab, 1)]
    for n_in, n_out, count in todo:
        a, b = torch.randn(rows, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype)  # (M, K), (N, K)
        seconds += count * _seconds(a, b, budget)
        flops += count * 2.0 * rows * n_in * n_out
    return flops / seconds / 1e9


@dataclass(frozen=True)
class Roof:
    """The measured peak and the decode roof it gives."""

    gflops: float
    """Matmul GFLOP/s on the model's decoding shapes."""
    gflop_per_token: float
    threads: int
    rows: int

    @property
    def tokens_per_second(self) -> float:
        return self.gflops / self.gflop_per_token

    def share(self, tokens_per_second: float) -> float:
        """The fraction of the roof a generation rate reaches."""
        return tokens_per_second / self.tokens_per_second


def measure_roof(model: nn.Module, rows: int = 512, budget: float = 0.3) -> Roof:
    """:func:`matmul_peak` and the per-token cost of ``model``, at torch's current thread count."""
    shapes = decode_shapes(model)
    return Roof(matmul_peak(shapes, rows, budget), shapes.flops_per_token / 1e9, torch.get_num_threads(), rows)


__all__ = ["DecodeShapes", "Roof", "decode_shapes", "matmul_peak", "measure_roof"]
