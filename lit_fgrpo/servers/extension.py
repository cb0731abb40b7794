"""The worker extension's earlier import path: servers started by hand with ``--worker-extension-cls
lit_fgrpo.servers.extension.WeightReceiver`` (or ``...extension.DirectoryReload``) still start. The class is
:class:`lit_fgrpo.engines.vllm_worker.WeightReceiver`, the one extension of both vLLM engines."""

from lit_fgrpo.engines.vllm_worker import WeightReceiver

DirectoryReload = WeightReceiver
"""The oldest name of the same class."""

__all__ = ["DirectoryReload", "WeightReceiver"]
