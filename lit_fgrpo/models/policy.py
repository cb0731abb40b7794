"""Building the policy and its tokenizer from settings; saving them for transformers.

What they are built from is checked first (:mod:`lit_fgrpo.models.policy_checks`: the folder, the config).

The optional LoRA wrapper lives in :mod:`lit_fgrpo.models.lora`; ``LoraSettings`` and ``apply_lora`` are re-exported here.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_fgrpo.distributed.full_copy import load_full_weights, unsharded_copy
from lit_fgrpo.models.lora import LoraSettings, apply_lora
from lit_fgrpo.models.policy_checks import (
    check_model_config,
    check_policy_folder,
    check_tokenizer_folder,
    config_for,
)


def load_tokenizer_folder(path: str) -> Any:
    """The tokenizer saved in a local folder (a task's own tokenizer, ``builtin:<task>``, is
    :func:`lit_fgrpo.tasks.registry.load_tokenizer`'s).

    Raises:
        FileNotFoundError: If nothing is at ``path`` (no hub access at run time).
        ConfigError: If the folder holds no tokenizer.
    """
    from transformers import AutoTokenizer

    if not Path(path).exists():
        raise FileNotFoundError(
            f"--model.policy.tokenizer: {path!r} is not a local directory (no hub access at run time); "
            "pass a saved tokenizer folder"
        )
    if Path(path).is_dir():
        check_tokenizer_folder(path)
    return AutoTokenizer.from_pretrained(path)


def build_policy(
    model: str | None,
    model_config: dict[str, Any] | None,
    tokenizer: Any,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """A causal LM from a local path, or built from an HF config dict (``{"model_type": "qwen2", ...}``).

    A config build is seeded with ``seed`` in a forked RNG, so every rank builds the same weights and the global
    RNG is untouched. ``dtype`` is the weights' dtype (bf16 under ``precision="bf16-true"``).

    The model comes back in train mode either way (``from_pretrained`` returns it in eval mode, ``from_config`` in
    train mode), as Lightning expects at the start of fit ("Found N module(s) in eval mode"). The mode at rest
    changes no number: every forward of ours sets its own (:func:`lit_fgrpo.models.logprobs.module_mode`).
    """
    from transformers import AutoModelForCausalLM

    if (model is None) == (model_config is None):
        raise ValueError("FGRPOModule: give exactly one of `model` (a local path) or `model_config` (a config dict)")
    if model is not None:
        check_policy_folder(model)
        with _quiet_progress():
            return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).train()
    assert model_config is not None
    config = policy_config(model_config, tokenizer)
    with _seeded(seed):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def policy_config(model_config: dict[str, Any], tokenizer: Any) -> Any:
    """The HF config that ``model_config`` builds: vocab size and special ids default to the tokenizer's.

    Raises:
        ConfigError: a config :func:`check_model_config` refuses.
    """
    cfg = dict(model_config)
    check_model_config(cfg)
    cfg.setdefault("vocab_size", len(tokenizer))
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            cfg.setdefault(name, getattr(tokenizer, name))
    return config_for(cfg)


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers draws "Loading weights" and "Writing model shards" bars; into a log file (stderr not a terminal)
    their carriage-return frames are noise, so they are switched off there for the call."""
    from transformers.utils import logging as hf_logging

    quiet = hf_logging.is_progress_bar_enabled() and not sys.stderr.isatty()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            hf_logging.enable_progress_bar()


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Fork the torch RNG so that building a model from a config is reproducible and side-effect free."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def save_policy(policy: nn.Module, tokenizer: Any, directory: str | Path, merge_lora: bool = False) -> Path:
    """Save ``policy`` (with ``merge_lora``, its LoRA adapters merged into a copy) and ``tokenizer`` to
    ``directory``, loadable by transformers unchanged; returns the directory.

    transformers' "Writing model shards" bar is off when stderr is not a terminal (:func:`_quiet_progress`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if merge_lora:
        policy = copy.deepcopy(policy).merge_and_unload()  # type: ignore[operator]
    with _quiet_progress():
        policy.save_pretrained(directory)  # type: ignore[operator]
    tokenizer.save_pretrained(directory)
    return directory


def save_sharded_policy(policy: nn.Module, tokenizer: Any, directory: str | Path, write: bool) -> Path:
    """:func:`save_policy` for a sharded (FSDP2) policy: every rank gathers, the ``write`` rank saves a normal HF folder.

    The writing rank holds one whole copy on the CPU (what the folder will contain); LoRA is merged.
    """
    copy = unsharded_copy(policy, torch.device("cpu")) if write else None
    load_full_weights(copy, policy)
    if copy is not None:
        save_policy(copy, tokenizer, directory)
    return Path(directory)


__all__ = [
    "LoraSettings",
    "apply_lora",
    "build_policy",
    "check_model_config",
    "check_policy_folder",
    "check_tokenizer_folder",
    "load_tokenizer_folder",
    "policy_config",
    "save_policy",
    "save_sharded_policy",
]
