"""LoRA pushes: only the adapter travels, through vLLM's runtime LoRA loading, never the merged base.

With a PEFT policy the servers keep the frozen base weights and get each new adapter version as PEFT's own save
format (``adapter_config.json`` + ``adapter_model.safetensors``), loaded with ``/v1/load_lora_adapter`` under a new
name per version (``<served name>-lora-v<k>``); requests then name that adapter. A new name and path per version
also gives the adapter a new prefix-cache key (vLLM hashes the LoRA name and path into its block hashes), so no block
computed with an older adapter is reused; the cache is dropped anyway.

Launched servers need ``--enable-lora`` and a ``--max-lora-rank`` (one of vLLM's allowed ranks, at least the
adapter's), and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` for the load route (:func:`lora_serve_args`,
:data:`LORA_ENV`). Servers given by URL must have been started that way (``docs/engines.md`` shows the command).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

ADAPTER_FILE = "adapter_model.safetensors"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``)."""
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
"""What enables ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on a server."""


def adapter_rank(model: nn.Module) -> int | None:
    """The LoRA rank of a PEFT policy's active adapter; None for a model without adapters."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return None
    config: Any = model.peft_config[model.active_adapter]
    return int(config.r)


def server_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of rank ``rank``.

    Raises:
        ValueError: ``rank`` is above vLLM's largest.
    """
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")


def lora_serve_args(rank: int) -> tuple[str, ...]:
    """``vllm serve`` flags for runtime adapters up to ``rank``: one adapter per batch, two held (old and new)."""
    return ("--enable-lora", "--max-lora-rank", str(server_rank(rank)), "--max-loras", "1", "--max-cpu-loras", "2")


def write_adapter(model: nn.Module, directory: Path) -> int:
    """The policy's adapter in PEFT's save format in ``directory``; returns the bytes of its weights file."""
    policy: Any = model
    directory.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(directory), safe_serialization=True)
    return (directory / ADAPTER_FILE).stat().st_size


def adapter_name(served_name: str, version: int) -> str:
    """The name version ``version`` of the adapter is loaded and requested under."""
    return f"{served_name}-lora-v{version}"
