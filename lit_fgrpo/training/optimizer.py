"""The policy's AdamW and which of torch's kernels runs it.

torch has three AdamW kernels that compute the same update (up to float rounding): ``for_loop`` (one parameter at
a time), ``foreach`` (torch's default: lists of tensors per operation) and ``fused`` (one kernel over every
parameter). On the CPU only ``fused`` avoids a pass over memory per operation: one step over SmolLM2-135M's 135M
float32 weights took 0.49 s with ``foreach`` and 0.07-0.08 s fused (1 thread, 2-core AMD EPYC, 2026-12-04), a
tenth of an RL step there. ``auto`` picks it wherever torch has the kernel for every trainable parameter: plain
tensors on the CPU or a CUDA device. FSDP2's sharded parameters (DTensors) keep torch's own choice.

A checkpoint stores the kernel flags with its param groups and torch's ``load_state_dict`` would restore them;
:func:`use_configured_kernel` sets them back to the configured kernel once the state is loaded, so that the config
wins on resume (the moments and step counts are the same tensors for every kernel).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

import torch
from torch import nn

from lit_fgrpo.errors import ConfigError

AdamWKernel = Literal["auto", "fused", "foreach", "for_loop"]
FUSED_DEVICES = ("cpu", "cuda")
"""Device types with a fused AdamW kernel for float tensors (torch 2.4+)."""


def check_kernel(kernel: str, flag: str = "--model.optimizer.kernel") -> None:
    """Refuse an unknown kernel name, naming ``flag``."""
    if kernel not in get_args(AdamWKernel):
        raise ConfigError(f"{flag} must be one of {', '.join(get_args(AdamWKernel))}, got {kernel!r}")


def fused_supported(params: Iterable[nn.Parameter]) -> bool:
    """Whether torch's fused AdamW takes every parameter: plain float tensors on a CPU or CUDA device."""
    params = list(params)
    return bool(params) and all(
        type(p) in (torch.Tensor, nn.Parameter) and p.device.type in FUSED_DEVICES and p.is_floating_point()
        for p in params
    )


def kernel_flags(params: Iterable[nn.Parameter], kernel: AdamWKernel) -> dict[str, bool | None]:
    """``fused`` / ``foreach`` arguments of ``torch.optim.AdamW`` for ``kernel`` over ``params``.

    Raises:
        ConfigError: ``fused`` asked for parameters torch has no fused kernel for.
    """
    check_kernel(kernel)
    if kernel == "foreach":
        return {"fused": None, "foreach": True}
    if kernel == "for_loop":
        return {"fused": None, "foreach": False}
    supported = fused_supported(params)
    if kernel == "fused" and not supported:
        raise ConfigError(
            "--model.optimizer.kernel fused: torch has no fused AdamW for these parameters "
            f"(plain float tensors on {' or '.join(FUSED_DEVICES)} only; FSDP2 shards are DTensors): use auto"
        )
    return {"fused": True, "foreach": None} if supported else {"fused": None, "foreach": None}


def build_adamw(
    params: list[nn.Parameter], lr: float, weight_decay: float, betas: tuple[float, float], kernel: AdamWKernel
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params`` with the kernel ``kernel`` resolves to (see :func:`kernel_flags`)."""
    flags = kernel_flags(params, kernel)
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=betas, fused=flags["fused"], foreach=flags["foreach"]
    )


def use_configured_kernel(optimizer: torch.optim.Optimizer, flags: dict[str, bool | None]) -> None:
    """Set every param group's ``fused`` / ``foreach`` flags to ``flags`` (those the optimizer was built with):
    ``load_state_dict`` restores a checkpoint's flags, and a run resumed with another ``--model.optimizer.kernel``
    (or from a checkpoint written before it existed) keeps the configured kernel."""
    for group in optimizer.param_groups:
        group.update(flags)


__all__ = ["AdamWKernel", "build_adamw", "check_kernel", "fused_supported", "kernel_flags", "use_configured_kernel"]
