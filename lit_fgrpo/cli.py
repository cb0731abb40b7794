"""``lit-fgrpo``: LightningCLI over FGRPOModule + PromptDataModule, plus the ``simulate`` command.

    lit-fgrpo fit --config configs/maze_cpu.yaml          # the CPU maze demo
    lit-fgrpo fit --config configs/maze_cpu.yaml --print_config
    lit-fgrpo fit --help                                  # every setting with its docstring
    lit-fgrpo simulate --group-sizes 2 8 32 --seeds 2     # paper §5 categorical simulation
    lit-fgrpo maze-sweep --help                           # paper §6 GRPO vs F-GRPO over group sizes
    lit-fgrpo maze-report DIR                             # the verdict of a sweep from its per-seed CSVs

YAML configs are parsed with omegaconf, so ``${model.temperature}``-style interpolation works.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.mlflow_logging import MLflowSaveConfigCallback, default_logger_config
from lit_fgrpo.module import FGRPOModule


class FGRPOCLI(LightningCLI):
    """LightningCLI with the tokenizer shared between model and data."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.tokenizer", "data.tokenizer_path")


def cli_main(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> FGRPOCLI:
    """Build (and by default run) the Lightning CLI; ``args`` replaces ``sys.argv[1:]``."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # With manual optimisation the checkpoint holds the post-step state, which is exactly what resuming needs.
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    trainer_defaults = {"logger": default_logger_config(), "num_sanity_val_steps": 0}
    trainer_defaults |= kwargs.pop("trainer_defaults", {})
    return FGRPOCLI(
        FGRPOModule,
        PromptDataModule,
        args=args,  # type: ignore[arg-type]
        run=run,
        save_config_callback=MLflowSaveConfigCallback,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=trainer_defaults,
        parser_kwargs={"parser_mode": "omegaconf"},
        seed_everything_default=0,
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``lit-fgrpo``."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] == "simulate":
        from lit_fgrpo.theory.simulate_cli import main as simulate_main

        return simulate_main(words[1:])
    if words and words[0] == "maze-sweep":
        from lit_fgrpo.experiments.maze_sweep import main as sweep_main

        return sweep_main(words[1:])
    if words and words[0] == "maze-report":
        from lit_fgrpo.experiments.evidence_report import main as report_main

        return report_main(words[1:])
    cli_main(None if argv is None else words)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
