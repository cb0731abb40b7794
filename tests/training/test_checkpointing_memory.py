"""Gradient checkpointing takes effect: fewer activation bytes saved for backward, the same gradient.

Saved activations are counted exactly (not timed) with ``torch.autograd.graph.saved_tensors_hooks``: the pack
hook sees every tensor autograd keeps for backward outside the checkpointed regions. With checkpointing on, the
decoder layers keep only their inputs, so the total falls; the gradient is unchanged (the tiny model has no
dropout, so the recomputed forward is the same forward).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests.training.tiny_setup import TINY_MODEL, synthetic_rollout, tiny_module

CONFIG = TINY_MODEL | {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 256}


def saved_bytes_and_grads(checkpointing: bool) -> tuple[int, dict[str, Tensor]]:
    module = tiny_module(model_config=CONFIG, gradient_checkpointing=checkpointing, micro_batch_rows=64)
    module.policy.eval()  # as after generation: the module must switch to train mode itself
    rollout = synthetic_rollout(P=4, G=4, Tp=12, T=24)
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        if not isinstance(t, torch.nn.Parameter):  # weights are kept either way
            seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module.backward_on(rollout)
    assert not module.policy.training  # its mode is restored after the step
    grads = {name: p.grad.clone() for name, p in module.policy.named_parameters() if p.grad is not None}
    return sum(seen.values()), grads


def test_checkpointing_saves_less_for_backward_and_keeps_the_gradient() -> None:
    plain_bytes, plain_grads = saved_bytes_and_grads(False)
    ckpt_bytes, ckpt_grads = saved_bytes_and_grads(True)
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    assert plain_grads.keys() == ckpt_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
