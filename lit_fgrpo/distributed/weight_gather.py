"""Full policy weights, one tensor at a time, from a plain, DDP or FSDP2-sharded policy (LoRA merged).

Under FSDP2 (``fully_shard``) each parameter is a ``DTensor`` holding this rank's shard, so ``state_dict()`` cannot
be pushed into an inference engine as it is. :func:`iter_full_weights` walks the state dict in module order (layer
by layer), all-gathers one tensor at a time with ``DTensor.full_tensor()`` and yields it under the Hugging Face
checkpoint name that vLLM's ``load_weights`` expects. The caller consumes (copies into the engine) each tensor
before asking for the next, so at most one gathered tensor (plus, for a LoRA layer, its small adapter factors)
exists at a time: never a second full copy of the model.

Every rank must iterate to the end (each gather is a collective), even a rank whose engine does not need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


def full_tensor(tensor: Tensor) -> Tensor:
    """The whole tensor: all-gathered when ``tensor`` is a sharded ``DTensor``, ``tensor`` itself otherwise."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


def is_sharded(model: Any) -> bool:
    """Whether any parameter of ``model`` is a sharded ``DTensor`` (FSDP2): its weights must be gathered to push."""
    return any(callable(getattr(p, "full_tensor", None)) for p in model.parameters())


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _lora_layers(model: Any) -> dict[str, Any]:
    """PEFT LoRA layers by module name (those with ``base_layer``, ``lora_A`` and ``lora_B``)."""
    return {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")
    }


def _lora_delta(layer: Any, weight: Tensor) -> Tensor:
    """``sum_a scaling_a * B_a @ A_a`` over the active adapters (transposed for ``fan_in_fan_out``), in float32.

    Raises:
        NotImplementedError: For adapter kinds other than linear LoRA (embedding, conv, DoRA).
    """
    if getattr(layer, "use_dora", {}) and any(layer.use_dora.get(a, False) for a in layer.active_adapters):
        raise NotImplementedError("iter_full_weights: DoRA adapters are not supported for the weight push")
    delta = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if not isinstance(layer.lora_A[adapter], torch.nn.Linear):
            raise NotImplementedError(f"iter_full_weights: LoRA on {type(layer.base_layer).__name__} is not supported")
        a = full_tensor(layer.lora_A[adapter].weight).float()  # (r, in)
        b = full_tensor(layer.lora_B[adapter].weight).float()  # (out, r)
        product = b @ a  # (out, in)
        delta += (product.T if getattr(layer, "fan_in_fan_out", False) else product) * layer.scaling[adapter]
    return delta


def iter_full_weights(model: Any, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(name, full tensor)`` for every weight of the policy, in checkpoint names, streamed.

    Names follow :func:`lit_fgrpo.engines.vllm_worker.policy_state_dict`: a PEFT LoRA policy loses
    ``base_model.model.`` and ``.base_layer``, its ``lora_*`` factors are merged into the base weight
    (``W + scaling * B @ A``, unless the adapter is already merged), and ``lm_head.weight`` is yielded for
    tied-embedding models that lack it.

    Args:
        model: The policy: a ``PreTrainedModel`` or a PEFT model, plain or ``fully_shard``-ed (FSDP2).
        dtype: Cast each yielded tensor to this dtype (e.g. the engine's); ``None`` keeps the training dtype.

    Yields:
        ``(name, tensor)``. An unsharded tensor is the live parameter (no copy; clone before keeping it);
        a gathered one is a fresh full tensor, dropped by this iterator once the caller moves on.
    """
    peft = _is_peft(model)
    lora = _lora_layers(model) if peft else {}
    lora_weights = {f"{name}.base_layer.weight": layer for name, layer in lora.items()}
    seen: set[str] = set()
    for raw_name, shard in model.state_dict().items():
        name = raw_name
        if peft:
            if "lora_" in raw_name or ".original_module." in raw_name:
                continue
            name = raw_name.removeprefix("base_model.model.")
            name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        tensor = full_tensor(shard)
        layer = lora_weights.get(raw_name)
        if layer is not None and not getattr(layer, "merged", False):
            tensor = (tensor.float() + _lora_delta(layer, tensor)).to(tensor.dtype)
        if dtype is not None:
            tensor = tensor.to(dtype)
        seen.add(name)
        yield name, tensor
        del tensor
    base = model.get_base_model() if peft else model
    if "lm_head.weight" not in seen and hasattr(base, "get_input_embeddings"):
        # Tied output projection absent from the state dict: gather the embedding again rather than keep a copy
        # alive through the whole walk (vLLM keeps a stale lm_head when it is not sent).
        tensor = full_tensor(base.get_input_embeddings().weight.detach())
        yield "lm_head.weight", tensor if dtype is None else tensor.to(dtype)
