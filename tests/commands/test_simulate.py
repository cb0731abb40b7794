"""The categorical-simulation CLI: CSV, PNG and an MLflow run in a sqlite store under tmp_path."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lit_fgrpo.commands.simulate import CSV_NAME, PNG_NAME, main, metric_key

TINY = ["--group-sizes", "2", "16", "--gammas", "0", "1", "--seeds", "2", "--steps", "20"]
TINY += ["--num-actions", "500", "--num-correct", "40", "--workers", "1", "--quiet"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_cli_writes_csv_and_png_without_mlflow(tmp_path: Path) -> None:
    assert main([*TINY, "--out-dir", str(tmp_path), "--no-mlflow"]) == 0
    rows = read_rows(tmp_path / CSV_NAME)
    assert [(int(r["group_size"]), float(r["gamma"])) for r in rows] == [(2, 0.0), (16, 0.0), (2, 1.0), (16, 1.0)]
    for r in rows:
        assert int(r["num_seeds"]) == 2
        assert 0 < float(r["q_pos_mean"]) < 1 and 0 <= float(r["m_ret_mean"]) <= 1
        assert {"q_pos_seed0", "q_pos_seed1", "m_ret_seed0", "m_ret_seed1"} <= set(r)
    assert (tmp_path / PNG_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "mlartifacts").exists()


def test_cli_logs_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory besides what we ask for
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    assert main([*TINY, "--out-dir", str(out), "--mlflow", "--tracking-uri", uri, "--surrogate", "linear"]) == 0
    rows = read_rows(out / CSV_NAME)

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("categorical-simulation")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params["surrogate"] == "linear"
    assert run.data.params["group_sizes"] == "2 16"
    history = client.get_metric_history(run.info.run_id, metric_key("m_ret_mean", 1.0))
    by_step = {m.step: m.value for m in history}
    expected = {int(r["group_size"]): float(r["m_ret_mean"]) for r in rows if float(r["gamma"]) == 1.0}
    assert by_step == pytest.approx(expected)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {CSV_NAME, PNG_NAME} <= artifacts
    assert not (tmp_path / "mlruns").exists()


def test_cli_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lit_fgrpo.cli import main as cli_main

    assert cli_main(["simulate", "--seeds", "0", "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "lit-fgrpo simulate: error: --seeds must be >= 1, got 0\n"
    assert cli_main(["simulate", "--surrogate", "quadratic"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("lit-fgrpo simulate: error: argument --surrogate: invalid choice: 'quadratic'"), err
    assert len(err) == 2 and err[1].startswith("hint: ")
