"""Building the policy and its tokenizer from settings; saving them for transformers.

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

from lit_fgrpo.models.lora import LoraSettings, apply_lora

BUILTIN_MAZE_TOKENIZER = "builtin:maze"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files one of which a tokenizer folder holds."""


def load_tokenizer(name_or_path: str) -> Any:
    """A local tokenizer directory, or ``builtin:maze`` for the maze task's word-level vocabulary."""
    if name_or_path == BUILTIN_MAZE_TOKENIZER:
        from lit_fgrpo.tasks.maze import MAZE_VOCAB
        from lit_fgrpo.tasks.word_tokenizer import build_word_tokenizer

        return build_word_tokenizer(list(MAZE_VOCAB))
    from transformers import AutoTokenizer

    if not Path(name_or_path).exists():
        raise FileNotFoundError(
            f"--model.policy.tokenizer: {name_or_path!r} is not a local directory (no hub access at run time); "
            f"pass a saved tokenizer folder or {BUILTIN_MAZE_TOKENIZER!r}"
        )
    folder = Path(name_or_path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        from lit_fgrpo.errors import ConfigError

        raise ConfigError(
            f"{name_or_path}: no tokenizer in this folder (none of {', '.join(TOKENIZER_FILES)})",
            hint="pass --model.policy.tokenizer <folder>, or import a GGUF model with `lit-fgrpo import-gguf`",
        )
    return AutoTokenizer.from_pretrained(name_or_path)


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
        if not Path(model).exists():
            raise FileNotFoundError(f"--model.policy.model: {model!r} is not a local directory (no hub at run time)")
        return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).train()
    assert model_config is not None
    config = policy_config(model_config, tokenizer)
    with _seeded(seed):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def policy_config(model_config: dict[str, Any], tokenizer: Any) -> Any:
    """The HF config that ``model_config`` builds: vocab size and special ids default to the tokenizer's."""
    from transformers import AutoConfig

    cfg = dict(model_config)
    if "model_type" not in cfg:
        raise ValueError("--model.policy.model_config needs a `model_type` key, e.g. 'qwen2' or 'llama'")
    cfg.setdefault("vocab_size", len(tokenizer))
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            cfg.setdefault(name, getattr(tokenizer, name))
    return AutoConfig.for_model(**cfg)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Fork the torch RNG so that building a model from a config is reproducible and side-effect free."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def save_policy(policy: nn.Module, tokenizer: Any, directory: str | Path, merge_lora: bool = False) -> Path:
    """Save ``policy`` (with ``merge_lora``, its LoRA adapters merged into a copy) and ``tokenizer`` to
    ``directory``, loadable by transformers unchanged; returns the directory.

    transformers draws a "Writing model shards" bar; into a log file (stderr not a terminal) its carriage-return
    frames are noise, so it is switched off there for the save.
    """
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if merge_lora:
        policy = copy.deepcopy(policy).merge_and_unload()  # type: ignore[operator]
    quiet = hf_logging.is_progress_bar_enabled() and not sys.stderr.isatty()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        policy.save_pretrained(directory)  # type: ignore[operator]
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(directory)
    return directory


__all__ = [
    "BUILTIN_MAZE_TOKENIZER",
    "LoraSettings",
    "apply_lora",
    "build_policy",
    "load_tokenizer",
    "policy_config",
    "save_policy",
]
