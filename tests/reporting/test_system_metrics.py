"""System metrics on a real MLflow sqlite store: a run shorter than one sampling interval still carries them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.reporting.mlflow_logging import start_system_metrics, stop_system_metrics


def test_run_shorter_than_one_interval_gets_a_closing_sample(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = MLFlowLogger(experiment_name="t", tracking_uri=uri, artifact_location=str(tmp_path / "mlruns"))
    monitor = start_system_metrics(logger, interval_s=3600.0)  # MLflow's own loop would publish nothing in this test
    assert monitor is not None
    stop_system_metrics(monitor)
    metrics = MlflowClient(uri).get_run(logger.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics
    assert "system/system_memory_usage_megabytes" in metrics


def test_no_run_no_monitor() -> None:
    class NoRun:
        run_id = None

    assert start_system_metrics(NoRun()) is None
