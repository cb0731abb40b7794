"""LightningCLI end to end: every config parses, the tiny maze config runs and logs to a real MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.cli import cli_main, main

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "gamma:" in printed and "class_path: lit_fgrpo.callbacks.RolloutCallback" in printed
    assert "${" not in printed  # omegaconf interpolation was resolved


def test_help_shows_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "--model.gamma" in out and "focal exponent" in out
    assert "--data.prompts_per_step" in out


def test_unknown_loss_type_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--config", str(CONFIGS[0].parent / "maze_tiny.yaml"), "--model.loss_type", "ppo"]) == 2
    assert "\nerror: --model.loss_type: expected typing.Literal[" in "\n" + capsys.readouterr().err


def test_tiny_maze_run_logs_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    config = str(CONFIGS[0].parent / "maze_tiny.yaml")
    cli = cli_main(["fit", "--config", config])
    run_id = cli.trainer.logger.run_id  # type: ignore[union-attr]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    keys = set(run.data.metrics)
    expected = {
        "train/loss",
        "train/clip_frac",
        "train/kl",
        "train/entropy",
        "train/tokens_per_s",
        "rollout/reward_mean",
        "rollout/reward_std",
        "rollout/frac_active_groups",
        "rollout/completion_length",
        "rollout/tokens_per_s",
        "rollout/logprob_mismatch",
        "rollout/sync_logprob_delta",
        "focal/weight_mean",
        "focal/weight_min",
        "val/pass_at_1",
        "val/pass_at_8",
        "warm_start/loss",
        "final/pass_at_1",
    }
    assert expected <= keys, expected - keys
    assert not any("@" in key for key in keys)
    assert run.data.params["model.gamma"] == "0.5"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert "config.yaml" in artifacts and "samples" in artifacts
    policy_dir = tmp_path / "outputs" / "maze_tiny" / "policy"
    AutoModelForCausalLM.from_pretrained(policy_dir)
    assert AutoTokenizer.from_pretrained(policy_dir)("WALL PATH")["input_ids"] == [9, 8]
    assert (tmp_path / "outputs" / "maze_tiny" / "checkpoints" / "last.ckpt").exists()
