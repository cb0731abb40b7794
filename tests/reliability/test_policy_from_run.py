"""Loading a policy back from an MLflow run: a bad store, an unknown run or a run without a policy names the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.errors import CheckpointError, ConfigError
from lit_fgrpo.reporting import load_policy_from_run


def test_tracking_uri_without_a_scheme() -> None:
    with pytest.raises(ConfigError, match=r"^tracking_uri: 'mlflow.db' has no scheme; write sqlite:///mlflow.db"):
        load_policy_from_run("0123", "mlflow.db")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A sqlite store with one run that logged no policy: (tracking URI, run id)."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=(folder / "artifacts").as_uri())
    run = client.create_run(experiment)
    client.set_terminated(run.info.run_id)
    return uri, run.info.run_id


def test_unknown_run(store: tuple[str, str], tmp_path: Path) -> None:
    uri, _ = store
    with pytest.raises(CheckpointError, match=rf"^run 0badc0ffee in {uri}: no such run \("):
        load_policy_from_run("0badc0ffee", uri, dst_path=tmp_path)


def test_run_without_a_policy(store: tuple[str, str], tmp_path: Path) -> None:
    uri, run_id = store
    with pytest.raises(CheckpointError, match=rf"^run {run_id} in {uri}: no policy/ artifacts") as info:
        load_policy_from_run(run_id, uri, dst_path=tmp_path)
    assert info.value.hint == "the run logs its policy when trained with --model.policy.save_pretrained_dir"
