"""``FGRPOCLI``: the LightningCLI of ``lit-fgrpo fit`` / ``validate`` / ``test`` over FGRPOModule + PromptDataModule.

:func:`cli_main` builds it (and by default runs it); ``lit_fgrpo/cli.py`` (the ``lit-fgrpo`` entry point) dispatches
to it, and ``lit-fgrpo plan`` parses a fit config with it. YAML configs are parsed with omegaconf, so
``${model.objective.temperature}``-style interpolation works.

Resuming (``--ckpt_path FILE`` or ``--ckpt_path last``): the checkpoint is checked before use, and the config's model
and data settings win over the checkpoint's; see :mod:`lit_fgrpo.training.checkpointing`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_fgrpo.callbacks.progress_bar import default_progress_bar
from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.commands.cli_errors import trainer_error_message
from lit_fgrpo.commands.docstring_cache import cache_attribute_docstrings
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.library_noise import LIGHTNING, MLFLOW, hide
from lit_fgrpo.reporting.mlflow_logging import MLflowSaveConfigCallback, default_logger_config
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.tasks.registry import default_task, registered_tasks
from lit_fgrpo.training.module import FGRPOModule


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
        # Each registered task's settings are a group of the data module's (--data.maze.rows 5, `data: {maze: ...}`),
        # which takes them by the task's name; a run that names no source gets the default task.
        for task in registered_tasks():
            parser.add_class_arguments(task.settings, f"data.{task.name}")
        parser.set_defaults({"data.source": default_task().name})

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
    # validate/test --ckpt_path of a fit run in another --trainer.default_root_dir: the checkpoint callback's own
    # bookkeeping, which an evaluation neither reads nor writes
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
    hide(LIGHTNING + MLFLOW)  # Lightning's cloud tips, MLflow's monitor start/stop lines (reporting/library_noise.py)
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


__all__ = ["FGRPOCLI", "cli_main", "policy_tokenizer_path", "with_rollout_callback"]
