"""MLflow by default: a local sqlite store, the resolved config as an artifact and as params.

The experiment is tagged ``mlflow.experimentKind = custom_model_development`` so that MLflow 3 opens it in its
model-training view (runs, metric charts, artifacts) rather than the GenAI view (traces, judges, prompts), and
system metrics (CPU, memory, GPU) are sampled into the run under ``system/`` when psutil is installed.

mlflow is imported lazily; without it the CLI falls back to Lightning's CSVLogger (tested).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback

from lit_fgrpo.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_ARTIFACT_LOCATION = "./mlruns"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""MLflow 3's experiment type tag (its UI reads it to choose the GenAI or the model-training layout)."""
EXPERIMENT_KIND = "custom_model_development"
SYSTEM_METRICS_INTERVAL_S = 10.0


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def check_tracking_uri(uri: str, flag: str) -> str:
    """``uri`` if it names a store MLflow can open by scheme; a bare word or path is refused naming ``flag``.

    MLflow would read ``mlflow.db`` or ``./runs`` as a file-store directory (and MLflow 3 deprecates those), so a
    user meaning a sqlite database silently gets a folder of YAML files instead.

    Raises:
        ConfigError: ``"--tracking_uri: 'mlflow.db' has no scheme; ..."``.
    """
    if uri == "databricks" or _SCHEME.match(uri):
        return uri
    raise ConfigError(
        f"{flag}: {uri!r} has no scheme; write sqlite:///{uri if uri.endswith('.db') else 'mlflow.db'}, "
        "file:///absolute/path/mlruns or http://host:port"
    )


def mlflow_available() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def default_logger_config(experiment_name: str = "lit_fgrpo") -> dict[str, Any]:
    """The Trainer's default logger as a LightningCLI class_path/init_args dict."""
    if not mlflow_available():
        log.warning("mlflow is not installed: logging to CSV under ./lightning_logs instead")
        return {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "lightning_logs"}}
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {
            "experiment_name": experiment_name,
            "tracking_uri": check_tracking_uri(
                os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI), "MLFLOW_TRACKING_URI"
            ),
            "artifact_location": DEFAULT_ARTIFACT_LOCATION,
            "log_model": False,
        },
    }


def tag_experiment(logger: Any) -> None:
    """Mark the run's experiment as model training (see the module docstring); other loggers: nothing."""
    experiment_id = getattr(logger, "experiment_id", None)
    client: Any = getattr(logger, "experiment", None)
    if experiment_id is not None and hasattr(client, "set_experiment_tag"):
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


def start_system_metrics(logger: Any, interval_s: float = SYSTEM_METRICS_INTERVAL_S) -> Any:
    """Start MLflow's system-metrics sampler on the run (``system/cpu_utilization_percentage``, memory, GPU).

    Returns the monitor (stop it with ``.finish()``), or None without psutil or without an MLflow run.
    """
    run_id = getattr(logger, "run_id", None)
    if run_id is None or importlib.util.find_spec("psutil") is None:
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # The logger set the global tracking URI when it opened the run; the monitor uses it.
    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s)
    monitor.start()
    return monitor


def stop_system_metrics(monitor: Any) -> None:
    """Stop the sampler and log one closing sample.

    MLflow's monitor publishes only after a full sampling interval and drops what it holds when stopped, so a run
    shorter than ``SYSTEM_METRICS_INTERVAL_S`` (a smoke run, a tiny CI run) would otherwise carry no ``system/``
    metric at all, and a longer one would lose its last partial interval.
    """
    monitor.finish()
    monitor.collect_metrics()
    monitor.publish_metrics(monitor.aggregate_metrics())
    monitor.mlflow_logger.flush()


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    else:
        out[prefix] = value


class MLflowSaveConfigCallback(SaveConfigCallback):
    """Log the resolved config as ``config.yaml`` and as flattened params to the MLflow run.

    It also tags the experiment for MLflow's model-training view and samples system metrics during the run
    (:func:`tag_experiment`, :func:`start_system_metrics`).

    Lightning's own SaveConfigCallback asserts a log_dir, which an MLflow logger with a sqlite URI lacks;
    this one writes to the tracking store instead (and to the log dir for loggers that have one).
    """

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        logger = trainer.logger
        text = self.parser.dump(self.config, skip_unset=False)
        experiment = getattr(logger, "experiment", None)
        run_id = getattr(logger, "run_id", None)
        if run_id is not None and experiment is not None and hasattr(experiment, "log_text"):
            experiment.log_text(run_id, text, "config.yaml")
            flat: dict[str, Any] = {}
            _flatten("", self.config.as_dict() if hasattr(self.config, "as_dict") else dict(self.config), flat)
            params = {
                k: str(v)[:500]
                for k, v in flat.items()
                if k not in ("config",) and not k.startswith("trainer.callbacks")
            }
            logger.log_hyperparams(params)
        elif getattr(logger, "log_dir", None):
            path = os.path.join(logger.log_dir, self.config_filename)
            os.makedirs(logger.log_dir, exist_ok=True)
            with open(path, "w") as handle:
                handle.write(text)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not trainer.is_global_zero:
            return
        self.save_config(trainer, pl_module, stage)
        self.already_saved = True
        tag_experiment(trainer.logger)
        self._system_metrics = start_system_metrics(trainer.logger)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        monitor, self._system_metrics = getattr(self, "_system_metrics", None), None
        if monitor is not None:
            stop_system_metrics(monitor)
