"""A whole, unsharded copy of a sharded policy, filled one gathered tensor at a time.

Under FSDP2 every forward of the policy is a collective (each layer all-gathers its shards), so a rank cannot
generate with it on its own: rollout lengths differ between ranks and the ranks' forwards would stop lining up.
The colocated HF engine therefore samples with a plain copy (:class:`~lit_fgrpo.engines.hf_gathered.GatheredHFEngine`),
and ``save_pretrained`` writes one (:func:`lit_fgrpo.models.policy.save_sharded_policy`). Both fill it with
:func:`~lit_fgrpo.distributed.weight_gather.iter_full_weights`: each tensor is all-gathered, copied into the copy's
own parameter and dropped before the next one is gathered, so besides the copy at most one gathered tensor exists.
With LoRA the copy is the base architecture and receives the merged weights.

Every rank must call :func:`load_full_weights` (each gather is a collective); ranks with no copy pass ``None``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_fgrpo.distributed.weight_gather import iter_full_weights


def base_config(policy: nn.Module) -> Any:
    """The HF config of the policy's base model (the PEFT wrapper's inner model for LoRA)."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy  # type: ignore[operator]
    return base.config


def policy_dtype(policy: nn.Module) -> torch.dtype:
    """The dtype of the policy's floating-point parameters (the shards' dtype under FSDP2)."""
    return next(p.dtype for p in policy.parameters() if p.is_floating_point())


def policy_device(policy: nn.Module) -> torch.device:
    """The device of the policy's parameters (of this rank's shards under FSDP2)."""
    param = next(iter(policy.parameters()))
    to_local = getattr(param, "to_local", None)
    return to_local().device if callable(to_local) else param.device


def unsharded_copy(policy: nn.Module, device: torch.device | None = None) -> nn.Module:
    """A plain causal LM of the policy's base architecture, frozen, in eval mode (its weights still to be loaded).

    Built from the config (random values: fill it with :func:`load_full_weights`); its non-persistent buffers (rotary
    frequencies) are computed by the constructor, which is why it is not built on the meta device.
    """
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(), torch.device(device or policy_device(policy)):
        torch.manual_seed(0)
        copy = AutoModelForCausalLM.from_config(base_config(policy), dtype=policy_dtype(policy))
    copy.eval().requires_grad_(False)
    return copy


@torch.no_grad()
def load_full_weights(target: nn.Module | None, policy: nn.Module) -> int:
    """Gather ``policy``'s weights one tensor at a time into ``target`` (in place); returns the tensors copied.

    Args:
        target: The unsharded copy to fill, or ``None`` on a rank that only takes part in the gathers.
        policy: The (sharded, possibly LoRA) policy.

    Raises:
        KeyError: If the policy yields a weight the copy does not have.
    """
    slots: dict[str, torch.Tensor] = {}
    if target is not None:
        slots = dict(target.named_parameters(remove_duplicate=False)) | dict(target.named_buffers())
    copied = 0
    for name, tensor in iter_full_weights(policy):
        if target is None:
            continue
        if name not in slots:
            raise KeyError(f"load_full_weights: the unsharded copy has no {name!r}")
        slots[name].copy_(tensor)
        copied += 1
    return copied
