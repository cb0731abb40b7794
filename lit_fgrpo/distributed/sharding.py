"""FSDP2 sharding of the policy (and the frozen reference): ``fully_shard`` per decoder layer, then the root.

This is what Lightning's ``ModelParallelStrategy`` expects of ``LightningModule.configure_model``: the strategy
builds a device mesh and hands it to the module as ``self.device_mesh``; the module applies the parallelism itself.
:func:`shard_policy` does it for a Hugging Face causal LM (or a PEFT wrapper around one):

* each decoder layer (the classes the model names in ``_no_split_modules``, e.g. ``LlamaDecoderLayer``) becomes one
  FSDP unit, so at most one layer's full parameters exist at a time in forward and backward;
* then the root, which holds the embeddings, the final norm and the (possibly tied) output projection;
* optionally a :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` (bf16 parameters in compute, fp32 gradient
  reductions; the stored parameters keep their dtype, so use it with ``precision="32-true"``);
* optionally activation checkpointing, through Hugging Face's own ``gradient_checkpointing_enable`` (non-reentrant),
  which leaves parameter names unchanged (``checkpoint_wrapper`` would rename every layer's weights).

Every parameter becomes a ``DTensor`` holding this rank's ``Shard(0)`` piece (dim 0 split in ``world`` chunks).
Gradients are reduce-scattered (averaged like DDP), so the optimizer steps on shards give the weights of one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lit_fgrpo.errors import ConfigError


@dataclass
class ShardingSettings:
    """How the policy and the reference are sharded (``FSDP2Strategy(sharding=...)``)."""

    mixed_precision: bool = False
    """Compute in bf16 with fp32 gradient reductions (FSDP2 ``MixedPrecisionPolicy``); the stored parameters, the
    gradients and AdamW's states stay in the parameters' dtype (fp32 with ``precision: 32-true``). For GPUs."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (the same as ``--model.policy.gradient_checkpointing``)."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (ZeRO-3); False keeps them until backward (ZeRO-2)."""
    shard_reference: bool = True
    """Shard the frozen KL reference like the policy (1/world of its bytes per rank); False keeps a whole frozen
    copy on every rank (no collectives in its forward, world times the memory)."""


def fsdp_mesh(mesh: Any) -> Any:
    """The 1-D mesh of all ranks to shard over, from the mesh Lightning's ``ModelParallelStrategy`` builds.

    Lightning's mesh is 2-D, ``("data_parallel", "tensor_parallel")``; without tensor parallelism one of the two
    dimensions has size 1 and the other spans every rank.

    Raises:
        ConfigError: If both dimensions are larger than 1 (tensor parallelism, not supported by this library).
    """
    if mesh.ndim == 1:
        return mesh
    names = mesh.mesh_dim_names or ()
    spanning = [name for name in names if mesh[name].size() == mesh.size()]
    if not spanning:
        raise ConfigError(
            f"--trainer.strategy: a device mesh of shape {tuple(mesh.shape)} means tensor parallelism, which "
            "lit_fgrpo does not support; shard over all ranks (strategy model_parallel, tensor_parallel_size=1)"
        )
    return mesh[spanning[0]]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of an HF causal LM (PEFT wrappers included): the modules of a ``_no_split_modules`` class.

    Raises:
        ValueError: If the model names no such class or none is found (not a decoder-layer transformer).
    """
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"shard_policy: no decoder layer found in {type(model).__name__} (_no_split_modules={names})")
    return layers


def mixed_precision_policy(settings: ShardingSettings) -> Any:
    """bf16 compute and fp32 reductions when ``settings.mixed_precision``, else FSDP2's default (no casting)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not settings.mixed_precision:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_policy(policy: nn.Module, mesh: Any, settings: ShardingSettings | None = None) -> nn.Module:
    """``fully_shard`` every decoder layer of ``policy``, then the root, over all ranks of ``mesh`` (in place).

    Args:
        policy: An HF causal LM or a PEFT wrapper (trainable or frozen: the reference is sharded the same way).
        mesh: Lightning's device mesh (``LightningModule.device_mesh``) or a 1-D mesh.
        settings: Mixed precision, activation checkpointing, resharding.

    Returns:
        ``policy`` itself, now an ``FSDPModule`` whose parameters are ``DTensor`` shards.
    """
    from torch.distributed.fsdp import fully_shard

    settings = settings or ShardingSettings()
    world_mesh = fsdp_mesh(mesh)
    if settings.activation_checkpointing:
        enable = getattr(policy, "gradient_checkpointing_enable", None)
        if callable(enable):
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kwargs = {
        "mesh": world_mesh,
        "reshard_after_forward": settings.reshard_after_forward,
        "mp_policy": mixed_precision_policy(settings),
    }
    for layer in decoder_layers(policy):
        fully_shard(layer, **kwargs)
    fully_shard(policy, **kwargs)
    return policy
