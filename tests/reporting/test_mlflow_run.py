"""One tiny ``lit-fgrpo fit`` run as a subprocess with piped (non-TTY) output, then read back as a researcher would:
the console's status lines, and the MLflow store through MLflow's own client."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "maze_tiny.yaml"
pytestmark = pytest.mark.slow


@dataclass
class TinyRun:
    workdir: Path
    tracking_uri: str
    run_id: str
    experiment_id: str
    output: str


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    from mlflow.tracking import MlflowClient

    workdir = tmp_path_factory.mktemp("tiny_run")
    uri = f"sqlite:///{workdir}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "LIT_FGRPO_PROGRESS"} | {"MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-m", "lit_fgrpo", "fit", "--config", str(CONFIG)],
        cwd=workdir, env=env, capture_output=True, timeout=900,
    )  # fmt: skip
    # bytes, decoded by hand: text=True would turn a tqdm frame's "\r" into "\n" and hide it
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    assert done.returncode == 0, stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lit_fgrpo")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    return TinyRun(workdir, uri, run.info.run_id, experiment.experiment_id, stdout + stderr)


def test_non_tty_run_prints_warm_start_status_lines(tiny_run: TinyRun) -> None:
    total = yaml.safe_load(CONFIG.read_text())["trainer"]["callbacks"][0]["init_args"]["steps"]  # the warm start's
    pattern = rf"^warm start: step (\d+)/{total} \((\d+)%\), loss [\d.]+, \d\d:\d\d elapsed"
    steps = [int(step) for step, _ in re.findall(pattern, tiny_run.output, re.M)]
    tenths = [math.ceil(total * i / 10) for i in range(1, 11)]
    # a line at every 10 % of the steps (and, on a slow machine, possibly one more every 30 s), in order
    assert set(tenths) <= set(steps) and steps == sorted(set(steps)) and steps[-1] == total, steps
    rl = re.findall(r"^RL: step (\d+)/4 \(\d+%\), reward", tiny_run.output, re.M)
    assert rl and rl[-1] == "4"
    assert "Epoch 0/-2" not in tiny_run.output
    # no tqdm frames in a log: neither ours nor transformers' "Writing model shards" bar (switched off by save_policy)
    frames = [line for line in tiny_run.output.split("\n") if "\r" in line]
    phases = r"warm start|RL|pass@k|Epoch|Validation|Writing model shards"
    assert not [f for f in frames if re.search(phases, f)], frames


def test_non_tty_run_prints_evaluation_status_lines(tiny_run: TinyRun) -> None:
    # before RL: RolloutCallback.evaluate; after: Lightning's validation loop at the last step (val_check_interval 4)
    assert re.search(r"^pass@k before RL: batch (\d+)/\1 \(100%\), \d\d:\d\d elapsed$", tiny_run.output, re.M)
    assert re.search(r"^pass@k at step 4: batch \d+, \d\d:\d\d elapsed$", tiny_run.output, re.M)
    assert re.search(r"^pass@k figure: runs:/[0-9a-f]+/figures/pass_at_k\.png$", tiny_run.output, re.M)


def test_experiment_opens_in_the_model_training_view(tiny_run: TinyRun) -> None:
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(tiny_run.tracking_uri).get_experiment(tiny_run.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_system_metrics_are_sampled(tiny_run: TinyRun) -> None:
    pytest.importorskip("psutil")
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(tiny_run.tracking_uri).get_run(tiny_run.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics


def _artifacts(run: TinyRun, path: str | None = None) -> set[str]:
    from mlflow.tracking import MlflowClient

    return {a.path for a in MlflowClient(run.tracking_uri).list_artifacts(run.run_id, path)}


def test_pass_at_k_figure_is_an_artifact(tiny_run: TinyRun) -> None:
    assert "figures/pass_at_k.png" in _artifacts(tiny_run, "figures")


def test_focal_figure_is_an_artifact(tiny_run: TinyRun) -> None:
    assert "figures/focal.png" in _artifacts(tiny_run, "figures")


def test_run_logs_its_policy(tiny_run: TinyRun) -> None:
    assert "policy/config.json" in _artifacts(tiny_run, "policy")


def _greedy(model: torch.nn.Module, prompt_ids: list[int], eos: int | None) -> list[int]:
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False, pad_token_id=eos, eos_token_id=eos
        )
    return out[0, len(prompt_ids) :].tolist()


def test_policy_reloaded_from_the_run_generates_the_saved_tokens(tiny_run: TinyRun, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_fgrpo.reporting import load_policy_from_run

    saved_dir = tiny_run.workdir / "outputs" / "maze_tiny" / "policy"
    model, tokenizer = load_policy_from_run(tiny_run.run_id, tiny_run.tracking_uri, dst_path=tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(saved_dir).eval()
    saved_tokenizer = AutoTokenizer.from_pretrained(saved_dir)
    prompt = saved_tokenizer("WALL PATH WALL START PATH GOAL", add_special_tokens=False)["input_ids"]
    assert tokenizer("WALL PATH WALL START PATH GOAL", add_special_tokens=False)["input_ids"] == prompt
    assert _greedy(model, prompt, tokenizer.eos_token_id) == _greedy(saved, prompt, saved_tokenizer.eos_token_id)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
