"""One weight-gradient product per trainable linear weight over all the decoder calls of the prompt-shared pass.

The prompt-shared pass (:mod:`lit_fgrpo.models.prompt_sharing`) runs the decoder 1 + k times on a micro-batch: the
distinct prompts, then up to four length groups of completions. Under autograd every call's backward computes each
trainable weight's gradient over its own rows, ``dW_c = dY_c^T X_c``, and adds it into the weight's gradient: k + 1
products whose output is as large as the weight (for a group of a dozen rows, a thin product that mostly writes
memory) and k adds of weight-sized tensors. Full fine-tuning of SmolLM2-135M spent 7 % of its forward and backward
in those adds alone (docs/real-model.md).

Here, inside :func:`deferred_weight_grads`, each trainable ``nn.Linear`` of the decoder computes only its input's
gradient in backward and keeps its rows ``(X_c, dY_c)``; one node on the decoder's input embeddings, whose backward
runs after every call's (each call's input comes through it), forms each weight's gradient in one product over all
the rows::

    dW = [dY_0; ...; dY_k]^T [X_0; ...; X_k]        db = sum of the rows of [dY_0; ...; dY_k]

and returns it to autograd as that weight's gradient, so gradient accumulation and DDP's hooks see an ordinary
gradient. The value is the same sum in another order (float rounding only: tests/models/test_deferred_grads.py
against the per-call products and float64).

Cost: the kept ``dY`` rows (the sum of the linear layers' output widths per token per layer: 5,184 floats on
SmolLM2) live until that node runs, and the weights' gradients are formed together there, not layer by layer.
Not used (ordinary autograd) under autocast, under FSDP (it reduces each layer's gradient as soon as that layer's
backward ends), for weights that are not plain leaf tensors, and
for thin weights (a side under :data:`MIN_SIDE`: LoRA's adapters, whose per-call products are as small as their
rows, so keeping ``dY`` would cost more than it saves; LoRA's frozen base needs no weight gradient at all).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_SIDE = 128
"""Smallest input and output width of a deferred weight."""


class RowStash:
    """Rows ``(X, dY)`` of each deferred linear layer, appended by the layers' backward, consumed once."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        self.layers = layers
        self.inputs: list[list[Tensor]] = [[] for _ in layers]
        self.grads: list[list[Tensor]] = [[] for _ in layers]

    def parameters(self) -> list[Tensor]:
        """The deferred weights, then the trainable biases, in a fixed order (the collecting node's inputs)."""
        biases = [layer.bias for layer in self.layers if layer.bias is not None and layer.bias.requires_grad]
        return [layer.weight for layer in self.layers] + biases

    def gradients(self) -> list[Tensor | None]:
        """One product per weight over every kept row (None where a layer kept none), then the biases' sums;
        the kept rows are released."""
        weights: list[Tensor | None] = []
        biases: list[Tensor | None] = []
        for i, layer in enumerate(self.layers):
            if not self.grads[i]:
                weights.append(None)
                if layer.bias is not None and layer.bias.requires_grad:
                    biases.append(None)
                continue
            dy = torch.cat(self.grads[i]) if len(self.grads[i]) > 1 else self.grads[i][0]  # (R, out)
            x = torch.cat(self.inputs[i]) if len(self.inputs[i]) > 1 else self.inputs[i][0]  # (R, in)
            weights.append(dy.t().mm(x))  # (out, in)
            if layer.bias is not None and layer.bias.requires_grad:
                biases.append(dy.sum(0))  # (out,)
            self.inputs[i], self.grads[i] = [], []
        return weights + biases


class _DeferredLinear(torch.autograd.Function):
    """``x W^T + b`` whose backward returns only ``dX`` and keeps ``(X, dY)`` for :class:`_CollectGradients`."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, stash: RowStash, slot: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.stash, ctx.slot = stash, slot
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, None, None, None, None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        ctx.stash.inputs[ctx.slot].append(x.reshape(-1, x.shape[-1]))  # (rows, in)
        ctx.stash.grads[ctx.slot].append(dy.reshape(-1, dy.shape[-1]))  # (rows, out)
        dx = dy.matmul(weight) if ctx.needs_input_grad[0] else None  # (..., in)
        return dx, None, None, None, None


class _CollectGradients(torch.autograd.Function):
    """Identity on the input embeddings; its backward runs after every decoder call's and returns the deferred
    weights' gradients (:meth:`RowStash.gradients`)."""

    @staticmethod
    def forward(ctx: Any, stash: RowStash, embeds: Tensor, *params: Tensor) -> Tensor:
        ctx.stash = stash
        return embeds.clone()  # a new tensor, not a view of the input (later in-place ops stay legal)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return (None, grad, *ctx.stash.gradients())


def _sharded(decoder: nn.Module) -> bool:
    """Whether FSDP manages the decoder's layers: FSDP reduces each layer's gradient right after that layer's
    backward, before a deferred gradient would exist."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in decoder.modules())


def deferrable_layers(decoder: nn.Module, min_side: int = MIN_SIDE) -> list[nn.Linear]:
    """The decoder's ``nn.Linear`` layers whose weight takes a gradient and can be deferred (a plain leaf tensor, both
    sides at least ``min_side``); empty under autocast or without grad."""
    weight = next(decoder.parameters(), None)
    if weight is None or not torch.is_grad_enabled() or _sharded(decoder):
        return []
    if torch.is_autocast_enabled(weight.device.type):  # the products run in another dtype than the kept rows
        return []
    return [
        m
        for m in decoder.modules()
        if type(m) is nn.Linear
        and m.weight.requires_grad
        and m.weight.is_leaf
        and min(m.weight.shape) >= min_side
        and type(m.weight.data) is Tensor
        and (m.bias is None or type(m.bias.data) is Tensor)
    ]


@contextmanager
def deferred_weight_grads(decoder: nn.Module, enabled: bool = True, min_side: int = MIN_SIDE) -> Iterator[Any]:
    """Defer the decoder's trainable linear weights' gradients to one product each (module docstring).

    Yields a function that every decoder call's input embeddings must pass through (``embeds = collect(embeds)``,
    once, on the one tensor the calls' inputs are taken from); while the context is open, each deferred layer's
    forward keeps its rows. Where nothing can be deferred (or ``enabled`` is False) it yields the identity and
    changes nothing.
    """
    layers = deferrable_layers(decoder, min_side) if enabled else []
    if not layers:
        yield lambda embeds: embeds
        return
    stash = RowStash(layers)

    def forward_of(slot: int, layer: nn.Linear) -> Any:
        def forward(x: Tensor) -> Tensor:
            bias = layer.bias.detach() if layer.bias is not None else None
            return _DeferredLinear.apply(x, layer.weight.detach(), bias, stash, slot)

        return forward

    for slot, layer in enumerate(layers):
        layer.forward = forward_of(slot, layer)  # type: ignore[method-assign]
    try:
        yield lambda embeds: _CollectGradients.apply(stash, embeds, *stash.parameters())
    finally:
        for layer in layers:
            del layer.forward  # back to the class's forward


__all__ = ["RowStash", "deferrable_layers", "deferred_weight_grads"]
