"""What a policy is built from, checked before any model is built: the folder of ``--model.policy.model`` or the
config of ``--model.policy.model_config``.

A folder whose config is not JSON or names no transformers model type, with no weight file, a weight file that is
truncated or not safetensors, a shard the index names but the folder lacks, or a tokenizer file that is not JSON is
one line naming the file, instead of a transformers or safetensors traceback deep in the load (one of which named
neither the folder nor the file). A config with a size that is not a positive integer or heads that do not split is
one line naming the key, instead of a validation traceback, or a model that fails at its first forward.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from lit_fgrpo.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files one of which a tokenizer folder holds."""
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""What ``from_pretrained`` loads weights from, in its order: one file, or an index of shards."""
MODEL_FLAG = "--model.policy.model"
SAFETENSORS_MAX_HEADER = 100_000_000
"""The largest header the safetensors library reads (its ``MAX_HEADER_SIZE``)."""


def check_policy_folder(path: str, tokenizer: bool = False) -> None:
    """Refuse a ``--model.policy.model`` folder that ``from_pretrained`` could not load, before anything is built.

    Checks ``config.json`` (JSON naming a transformers ``model_type``), the weights (one of :data:`WEIGHT_FILES`; every
    shard of an index present; each safetensors file's header readable and its tensors inside the file) and, with
    ``tokenizer`` (the folder is also the tokenizer's), the tokenizer files (:func:`check_tokenizer_folder`).

    Raises:
        FileNotFoundError: nothing is at ``path`` (no hub access at run time).
        ConfigError: one line naming the folder or the file and what is wrong.
    """
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"{MODEL_FLAG}: {path!r} is not a local directory (no hub at run time)")
    if not folder.is_dir():
        raise ConfigError(f"{MODEL_FLAG}: {path} is a file; give the model's folder (config.json, weights, tokenizer)")
    config = _json_file(folder / "config.json", "the model's config", _IMPORT_HINT)
    _check_model_type(folder / "config.json", config)
    weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if weights is None:
        raise ConfigError(f"{path}: no weights in this folder (none of {', '.join(WEIGHT_FILES)})", hint=_IMPORT_HINT)
    files = [weights]
    if weights.name.endswith(".index.json"):
        weight_map = _json_file(weights, "the index of the weight shards").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{weights}: no weight_map of tensor names to shard files")
        files = [folder / str(name) for name in sorted(set(weight_map.values()))]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise ConfigError(f"{weights} names shard(s) this folder lacks: {', '.join(missing[:5])}")
    for file in files:
        _check_weight_file(file)
    if tokenizer:
        check_tokenizer_folder(path)


_IMPORT_HINT = "save a model with save_pretrained, or import a GGUF file with `lit-fgrpo import-gguf`"


def _json_file(path: Path, what: str, hint: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path``, or one line naming the file."""
    if not path.is_file():
        raise ConfigError(f"{path.parent}: no {path.name} in this folder ({what})", hint=hint)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text ({what})") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}:{err.lineno}: not valid JSON ({err.msg}; {what})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object ({what}), got a {type(value).__name__}")
    return value


def _check_model_type(path: Path, config: dict[str, Any]) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"{path}: no model_type (the transformers architecture, e.g. 'llama')")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ConfigError(f"{path}: model_type {model_type!r} is not a transformers model type")


def _check_weight_file(path: Path) -> None:
    """A safetensors file whose header is readable and whose tensors end inside the file; a ``.bin`` that is a
    torch zip archive or a pickle. One line naming the file otherwise."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            size = path.stat().st_size
            if path.suffix != ".safetensors":
                if not (head.startswith(b"PK") or head[:1] == b"\x80"):
                    raise ConfigError(f"{path}: not a torch weight file (neither a zip archive nor a pickle)")
                return
            if len(head) < 8:
                raise ConfigError(f"{path}: not a safetensors file ({size} bytes, shorter than its header size)")
            (header_size,) = struct.unpack("<Q", head)
            if header_size > min(size - 8, SAFETENSORS_MAX_HEADER):
                raise ConfigError(
                    f"{path}: not a readable safetensors file (its header claims {header_size} bytes, the file has "
                    f"{size}: truncated, or another format)"
                )
            header = json.loads(handle.read(header_size))
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError(f"{path}: not a readable safetensors file (its header is not JSON)") from None
    data = size - 8 - header_size
    entries = [entry for key, entry in header.items() if key != "__metadata__"] if isinstance(header, dict) else None
    offsets = [entry.get("data_offsets") if isinstance(entry, dict) else None for entry in entries or []]
    if entries is None or not all(isinstance(o, list) and len(o) == 2 and isinstance(o[1], int) for o in offsets):
        raise ConfigError(f"{path}: not a readable safetensors file (its header is not a table of tensors)")
    ends = [int(o[1]) for o in offsets]  # type: ignore[index]
    if ends and max(ends) > data:
        raise ConfigError(f"{path}: truncated: its tensors need {max(ends)} bytes of data, the file holds {data}")


def check_tokenizer_folder(path: str) -> None:
    """Refuse a folder with no tokenizer file (:data:`TOKENIZER_FILES`), or whose JSON tokenizer files are not JSON.

    Raises:
        ConfigError: one line naming the folder or the file.
    """
    folder = Path(path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{path}: no tokenizer in this folder (none of {', '.join(TOKENIZER_FILES)})",
            hint="pass --model.policy.tokenizer <folder>, or import a GGUF model with `lit-fgrpo import-gguf`",
        )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            _json_file(folder / name, "the tokenizer")


CONFIG_FLAG = "--model.policy.model_config"
MODEL_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
"""The sizes of a config that must be integers >= 1 when given."""


def check_model_config(model_config: Any) -> None:
    """Refuse a ``--model.policy.model_config`` that transformers would not build, or would build into a model that
    fails at its first forward: no or an unknown ``model_type``, a size that is not an integer >= 1, attention heads
    that do not split the hidden size (without ``head_dim``) or that key/value heads do not divide, and whatever
    else transformers' own validation of the config refuses. Before anything is built (the CLI's config checks).

    Raises:
        ConfigError: one line naming ``--model.policy.model_config`` (and the key).
    """
    if not isinstance(model_config, dict):
        raise ConfigError(f"{CONFIG_FLAG} must be a mapping of a transformers config, got {model_config!r}")
    model_type = model_config.get("model_type")
    if not model_type:
        raise ConfigError(f"{CONFIG_FLAG} needs a `model_type` key, e.g. 'qwen2' or 'llama'")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise ConfigError(
            f"{CONFIG_FLAG}: model_type {model_type!r} is not a transformers model type",
            hint="use one transformers knows, e.g. 'llama' or 'qwen2'",
        )
    for key in MODEL_SIZES:
        value = model_config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{CONFIG_FLAG}.{key} must be an integer >= 1, got {value!r}")
    heads, kv_heads = model_config.get("num_attention_heads"), model_config.get("num_key_value_heads")
    hidden = model_config.get("hidden_size")
    if heads and hidden and "head_dim" not in model_config and hidden % heads:
        raise ConfigError(f"{CONFIG_FLAG}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if heads and kv_heads and heads % kv_heads:
        raise ConfigError(
            f"{CONFIG_FLAG}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads} "
            "(each key/value head serves a whole group of query heads)"
        )
    config_for(model_config)


def config_for(model_config: dict[str, Any]) -> Any:
    """``AutoConfig.for_model``, its validation error (a value transformers refuses) as one line naming the flag."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(**model_config)
    except (StrictDataclassError, ValueError, TypeError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ConfigError(f"{CONFIG_FLAG}: {lines[-1] if lines else type(err).__name__}") from None


__all__ = [
    "MODEL_SIZES",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "check_model_config",
    "check_policy_folder",
    "check_tokenizer_folder",
    "config_for",
]
