"""The weight payload pushed into vLLM: built from the trainer's policy, loaded inside the vLLM worker.

Trainer side: :func:`policy_state_dict` gives checkpoint-format names (``model.layers.0...``) for a plain
``PreTrainedModel`` or a PEFT LoRA policy (merged), always including ``lm_head.weight``.
Worker side: :class:`WeightSyncExtension` lets a multiprocess vLLM engine receive new policy weights.

vLLM mixes this class into its worker (``LLM(..., worker_extension_cls=WORKER_EXTENSION)``), so its
methods run inside the engine process with ``self`` being the worker and are reached through
``llm.collective_rpc("load_safetensors_blob", args=(blob,))``. Tensors are shipped as one safetensors
blob because ``collective_rpc`` serialises tensors passed as keyword arguments into nested lists.
This module must import without vLLM installed (vLLM imports it by name inside the worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

WORKER_EXTENSION = "lit_fgrpo.engines.vllm_worker.WeightSyncExtension"
"""The qualified name to pass as ``worker_extension_cls``."""


def _tie_lm_head(model: Any, state_dict: dict[str, Any]) -> None:
    """Add ``lm_head.weight`` for tied-embedding models when the state dict lacks it.

    vLLM silently keeps a stale output projection on CPU when only the embedding is sent.
    """
    if "lm_head.weight" not in state_dict and hasattr(model, "get_input_embeddings"):
        state_dict["lm_head.weight"] = model.get_input_embeddings().weight


@contextmanager
def merged_lora(model: Any) -> Iterator[None]:
    """A PEFT model's LoRA adapters merged into the base weights for the block, unmerged after (even on error);
    any other model unchanged. What :func:`policy_state_dict` needs of a PEFT policy."""
    merge = hasattr(model, "peft_config") and hasattr(model, "merge_adapter")
    if merge:
        model.merge_adapter()
    try:
        yield
    finally:
        if merge:
            model.unmerge_adapter()


def policy_state_dict(model: Any) -> dict[str, Any]:
    """Checkpoint-format state dict of the policy, as vLLM's ``load_weights`` expects it.

    * Plain model: ``model.state_dict()`` plus ``lm_head.weight`` (the input embedding when tied).
    * PEFT LoRA: the caller must have merged the adapter (:func:`merged_lora`); names lose
      ``base_model.model.`` and ``.base_layer``, ``lora_*`` tensors and ``original_module`` copies are
      dropped and ``modules_to_save.default`` copies take the plain name.

    The tensors are the live parameters (no copy); clone before handing them to another owner.
    """
    is_peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    base = model.get_base_model() if is_peft else model
    out: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        if is_peft:
            if "lora_" in name or ".original_module." in name:
                continue
            name = name.removeprefix("base_model.model.")
            name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        out[name] = tensor
    _tie_lm_head(base, out)
    return out


def state_dict_to_blob(state_dict: dict[str, Any]) -> bytes:
    """Serialise a state dict with safetensors (CPU, contiguous, tied tensors cloned apart).

    safetensors refuses tensors that share storage (tied embeddings), so every tensor is cloned.
    """
    from safetensors.torch import save

    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
    return save(tensors)


class WeightSyncExtension:
    """Methods added to the vLLM worker; ``self`` is a vLLM ``Worker`` (it has ``reload_weights``)."""

    def load_safetensors_blob(self, blob: bytes) -> int:
        """Reload the model weights in place from a safetensors blob of checkpoint-format names.

        Returns:
            The number of tensors received.
        """
        from safetensors.torch import load

        tensors = load(blob)
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)

    def weight_checksum(self) -> float:
        """Sum of all parameters of the engine's model (a cheap fingerprint for debugging)."""
        import torch

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return float(sum(p.float().sum().item() for p in model.parameters()))
