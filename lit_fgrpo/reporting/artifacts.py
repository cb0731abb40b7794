"""Figures and the trained policy as artifacts of the run, and the policy back from a run id alone.

The policy is logged as plain ``save_pretrained`` files under the run's ``policy/`` artifact folder (not as an
``mlflow.transformers`` model: that flavour needs a hub-style model card and a pipeline task, which a maze policy
with a word-level tokenizer has neither of). Reload with :func:`load_policy_from_run`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from lit_fgrpo.errors import CheckpointError

log = logging.getLogger(__name__)

POLICY_ARTIFACT_PATH = "policy"
"""Artifact folder of the run holding ``config.json``, the weights and the tokenizer files."""


def _mlflow_run(logger: Any) -> tuple[Any, str] | None:
    """(MlflowClient, run_id) of a Lightning MLFlowLogger, None for any other logger."""
    from lightning.pytorch.loggers import MLFlowLogger

    if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
        return logger.experiment, logger.run_id
    return None


def log_figure(logger: Any, figure: Figure, artifact_file: str) -> str | None:
    """Log ``figure`` as ``artifact_file`` (e.g. ``figures/pass_at_k.png``) of the run.

    MLflow: an artifact of the run (shown in its Artifacts tab). Another logger with a ``log_dir``: a PNG file there.
    No logger: nothing. Returns where it went (None when nowhere).
    """
    run = _mlflow_run(logger)
    if run is not None:
        client, run_id = run
        client.log_figure(run_id, figure, artifact_file)
        return f"runs:/{run_id}/{artifact_file}"
    log_dir = getattr(logger, "log_dir", None) if logger is not None else None
    if log_dir:
        path = Path(log_dir) / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        return str(path)
    return None


def log_policy(logger: Any, directory: str | os.PathLike[str]) -> str | None:
    """Log a ``save_pretrained`` directory (weights, config, tokenizer) as the run's ``policy/`` artifacts.

    Returns ``runs:/<run_id>/policy``, or None when the logger is not MLflow (the directory stays on disk).
    """
    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise FileNotFoundError(f"log_policy: {directory} holds no save_pretrained model (no config.json)")
    run = _mlflow_run(logger)
    if run is None:
        return None
    client, run_id = run
    client.log_artifacts(run_id, str(directory), artifact_path=POLICY_ARTIFACT_PATH)
    client.set_tag(run_id, "lit_fgrpo.models.policy", f"runs:/{run_id}/{POLICY_ARTIFACT_PATH}")
    return f"runs:/{run_id}/{POLICY_ARTIFACT_PATH}"


def load_policy_from_run(
    run_id: str, tracking_uri: str, dst_path: str | os.PathLike[str] | None = None
) -> tuple[Any, Any]:
    """Download the run's ``policy/`` artifacts and load them.

    Args:
        run_id: the MLflow run id.
        tracking_uri: the store, e.g. ``sqlite:///mlflow.db``.
        dst_path: where to download (default: a new temporary folder).

    Returns:
        ``(model, tokenizer)``: a transformers causal LM in eval mode and its tokenizer.

    Raises:
        ConfigError: ``tracking_uri`` has no scheme.
        CheckpointError: the store has no such run, or the run holds no loadable ``policy/`` artifacts (each names
            the run and the store).
    """
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_fgrpo.reporting.mlflow_logging import check_tracking_uri

    check_tracking_uri(tracking_uri, "tracking_uri")
    where = f"run {run_id} in {tracking_uri}"
    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException as err:
        raise CheckpointError(f"{where}: no such run ({_first_line(err)})") from None
    try:
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id,
            artifact_path=POLICY_ARTIFACT_PATH,
            tracking_uri=tracking_uri,
            dst_path=None if dst_path is None else str(dst_path),
        )
    except (MlflowException, OSError):  # the run exists: its artifacts have no policy/ folder
        raise CheckpointError(
            f"{where}: no {POLICY_ARTIFACT_PATH}/ artifacts",
            hint="the run logs its policy when trained with --model.policy.save_pretrained_dir",
        ) from None
    if not (Path(local) / "config.json").is_file():
        raise CheckpointError(f"{where}: {POLICY_ARTIFACT_PATH}/ holds no save_pretrained model (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(local).eval()
    tokenizer = AutoTokenizer.from_pretrained(local)
    return model, tokenizer


def _first_line(err: BaseException) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__
