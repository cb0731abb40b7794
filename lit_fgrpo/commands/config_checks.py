"""Checks across settings of a parsed ``fit`` config, before any class is built: mistakes no single class can see.

* two rollout callbacks in ``trainer.callbacks`` (each would generate and attach its own rollouts);
* ``engine_kwargs`` (vLLM's options) given to an engine that ignores them (``hf``, ``hf_copy``);
* an MLflow logger whose ``tracking_uri`` has no scheme (see :func:`~lit_fgrpo.reporting.mlflow_logging.check_tracking_uri`);
* the server group of ``--rollout.engine vllm_server`` (:class:`~lit_fgrpo.servers.server_settings.ServerSettings`,
  and on the machine that launches them :func:`~lit_fgrpo.servers.launcher.check_launch_here`), before the policy
  is built and long before a server starts;
* the policy folder (``--model.policy.model``: :func:`~lit_fgrpo.models.policy_checks.check_policy_folder`) or config
  (``--model.policy.model_config``: :func:`~lit_fgrpo.models.policy_checks.check_model_config`).

Each raises :class:`~lit_fgrpo.errors.ConfigError` naming the key as the CLI prints it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.mlflow_logging import check_tracking_uri

ENGINES_WITHOUT_KWARGS = ("hf", "hf_copy")
"""Engines that take no ``engine_kwargs`` (they are passed to vLLM only)."""


def as_plain(value: Any) -> Any:
    """A parsed config group (jsonargparse's ``Namespace``) as a dict; any other value itself."""
    return value.as_dict() if hasattr(value, "as_dict") else value


def _entries(value: Any) -> list[dict[str, Any]]:
    value = as_plain(value)
    items = value if isinstance(value, list) else [value] if value else []
    return [as_plain(item) for item in items if isinstance(as_plain(item), dict)]


def _class(path: str) -> type | None:
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None  # jsonargparse names a class path that does not import
    return found if isinstance(found, type) else None


def check_callbacks(callbacks: Any) -> None:
    """Refuse a second rollout callback and vLLM options given to an engine that does not read them.

    Raises:
        ConfigError: ``"--trainer.callbacks[0] and [3] are both rollout callbacks ..."`` and the like.
    """
    from lit_fgrpo.callbacks.rollout import RolloutCallback

    rollouts = []
    for index, entry in enumerate(_entries(callbacks)):
        cls = _class(str(entry.get("class_path", "")))
        if cls is None or not issubclass(cls, RolloutCallback):
            continue
        rollouts.append(f"[{index}]")
        init_args = as_plain(entry.get("init_args")) or {}
        engine, options = init_args.get("engine", "auto"), init_args.get("engine_kwargs")
        if options and engine in ENGINES_WITHOUT_KWARGS:
            raise ConfigError(
                f"--trainer.callbacks[{index}] ({cls.__name__}): engine_kwargs {sorted(options)} are vLLM options; "
                f"engine {engine!r} does not use them",
                hint="drop engine_kwargs, or choose engine: vllm",
            )
    if len(rollouts) > 1:
        raise ConfigError(
            f"--trainer.callbacks{rollouts[0]} and {' and '.join(rollouts[1:])} are both RolloutCallback: "
            "a run has one rollout callback (it generates and attaches every batch's rollouts)"
        )


def check_loggers(logger: Any) -> None:
    """Refuse an MLflow logger whose ``tracking_uri`` has no scheme, naming ``--trainer.logger``."""
    for entry in _entries(logger):
        uri = (as_plain(entry.get("init_args")) or {}).get("tracking_uri")
        if "MLFlowLogger" in str(entry.get("class_path", "")) and isinstance(uri, str):
            check_tracking_uri(uri, "--trainer.logger.init_args.tracking_uri")


def _rollout_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The run's rollout settings: the ``rollout:`` group, or a RolloutCallback's in ``trainer.callbacks``."""
    from lit_fgrpo.callbacks.rollout import RolloutCallback

    trainer = as_plain(config.get("trainer")) or {}
    for entry in _entries(trainer.get("callbacks")):
        cls = _class(str(entry.get("class_path", "")))
        if cls is not None and issubclass(cls, RolloutCallback):
            return as_plain(entry.get("init_args")) or {}
    return as_plain(config.get("rollout")) or {}


def launches_here() -> bool:
    """Whether this process is the one that would launch servers: rank 0 (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``
    unset or 0) on node 0 (``NODE_RANK``, ``GROUP_RANK`` unset or 0). Other ranks' machines may have other cores; the
    launch checks again on the machine that launches (:func:`~lit_fgrpo.servers.launcher.launch_servers`)."""
    names = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK")
    return all(os.environ.get(name, "0") in ("", "0") for name in names)


def check_engine_kwargs(rollout: dict[str, Any]) -> None:
    """The server group of ``--rollout.engine vllm_server``: counts, types, ranges and URLs
    (:meth:`ServerSettings.from_kwargs <lit_fgrpo.servers.server_settings.ServerSettings.from_kwargs>`), and on the
    machine that would launch them the cores, host and ports (:func:`~lit_fgrpo.servers.launcher.check_launch_here`).

    Raises:
        ConfigError: one line naming ``--rollout.engine_kwargs.<key>`` and the value.
    """
    if rollout.get("engine") != "vllm_server":
        return
    from lit_fgrpo.servers.launcher import check_launch_here
    from lit_fgrpo.servers.server_settings import ServerSettings

    settings = ServerSettings.from_kwargs(as_plain(rollout.get("engine_kwargs")) or {})
    if launches_here():
        check_launch_here(settings)


def check_fit_config(config: Any) -> None:
    """All of this module's checks on one subcommand's parsed config (a jsonargparse Namespace or a dict)."""
    config = as_plain(config)
    trainer = as_plain(config.get("trainer")) or {}
    check_callbacks(trainer.get("callbacks"))
    check_loggers(trainer.get("logger"))
    check_engine_kwargs(_rollout_settings(config))
    policy = as_plain(as_plain(config.get("model") or {}).get("policy")) or {}
    if policy.get("model_config") is not None:
        from lit_fgrpo.models.policy_checks import check_model_config

        check_model_config(policy["model_config"])
    if isinstance(policy.get("model"), str):  # the folder is the tokenizer's too unless --model.policy.tokenizer is set
        from lit_fgrpo.models.policy_checks import check_policy_folder

        check_policy_folder(policy["model"], tokenizer=policy.get("tokenizer") is None)
