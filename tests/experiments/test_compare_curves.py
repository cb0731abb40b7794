"""The compare report's training records: CSV logs written by Lightning's own CSVLogger, read back and summarised."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch.loggers import CSVLogger

from lit_fgrpo.experiments.compare_curves import METRICS_CSV, band, curve_figure, load_run, training_table
from lit_fgrpo.experiments.compare_runs import CompareSettings, main, run_dir

ROOT = Path(__file__).resolve().parents[2]


def log_run(folder: Path, val: dict[int, float], weights: list[float], all_wrong: list[float]) -> None:
    """A run's log as the fit's CSVLogger writes it (``configs/smollm2/csv_metrics.yaml``)."""
    logger = CSVLogger(save_dir=str(folder), name="metrics", version=0)
    # Lightning logs what follows the k-th RL step at step k - 1 (its optimizer steps count from 0)
    for step, (weight, wrong) in enumerate(zip(weights, all_wrong, strict=True), start=1):
        logger.log_metrics({"focal/weight_median": weight, "rollout/frac_all_wrong": wrong,
                            "rollout/generated_tokens": 100.0 + step}, step=step - 1)  # fmt: skip
        if step in val:
            logger.log_metrics({"val/pass_at_1": val[step]}, step=step - 1)
    logger.save()
    assert (folder / METRICS_CSV).is_file()


def test_a_run_log_read_back_against_the_values_logged(tmp_path: Path) -> None:
    weights, wrong = [0.9, 0.7, 0.8, 0.6], [0.5, 0.25, 0.25, 0.0]
    log_run(tmp_path, {2: 0.2, 4: 0.4}, weights, wrong)
    loaded = load_run(tmp_path)
    assert loaded is not None
    curve, summary = loaded
    assert curve == {2: 0.2, 4: 0.4}
    assert summary["focal/weight_median"] == pytest.approx(sum(weights) / 4)
    assert summary["rollout/frac_all_wrong"] == pytest.approx(sum(wrong) / 4)
    assert summary["rollout/generated_tokens"] == pytest.approx(sum(100.0 + s for s in range(1, 5)))
    assert summary["focal/weight_median_p10"] == pytest.approx(float(np.quantile(weights, 0.1)))
    assert load_run(tmp_path / "nothing") is None


def test_band_is_mean_min_max_over_the_steps_every_seed_has() -> None:
    steps, mean, low, high = band([{10: 0.1, 20: 0.3}, {10: 0.3, 20: 0.5, 30: 0.9}])
    assert steps == [10, 20] and mean == pytest.approx([0.2, 0.4]) and low == [0.1, 0.3] and high == [0.3, 0.5]
    figure = curve_figure(
        {"GRPO": [{10: 0.1}], "F-GRPO": [{5: 0.1, 10: 0.2}, {5: 0.3, 10: 0.4}, {10: 0.9}]}, start=0.05
    )
    lines = figure.axes[0].get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[0, 10], [0, 5, 10]]
    # the line is the seeds validated at every step; the one validated only at the end is a dot, not in the mean
    assert list(lines[1].get_ydata()) == pytest.approx([0.05, 0.2, 0.3])
    dots = figure.axes[0].collections[-1].get_offsets()
    assert [tuple(p) for p in dots] == [(pytest.approx(10.075), 0.9)]  # beside the other arm's, at step 10


def test_training_table_means_and_ranges() -> None:
    rows = training_table({"A": [{"rollout/frac_all_wrong": 0.2}, {"rollout/frac_all_wrong": 0.4}], "B": [{}]})
    assert "| A | 2 |" in rows[2] and "0.300 (0.200-0.400)" in rows[2]
    assert rows[3].startswith("| B | 1 | -")


def test_report_from_saved_runs_has_preregistration_curves_and_mlflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report is rebuilt from the saved files alone (--report-only), twice to the same text."""
    prereg = {"metrics": ["pass_at_1", "pass_at_16"], "rule": "both 95 % t intervals above 0"}
    settings = CompareSettings(
        fit_configs=[str(ROOT / "configs" / "maze_tiny.yaml")], arms={"GRPO": [], "F-GRPO": []}, baseline="GRPO",
        seeds=[1, 2, 3], out_dir=str(tmp_path / "runs"), preregistration=prereg, deviations="seed 3 validated once",
        mlflow=f"sqlite:///{tmp_path / 'mlflow.db'}", base_results="demo.json",
    )  # fmt: skip
    before = {"pass_at_1": 0.125, "pass_at_16": 0.5, "ci95_pass_at_1": 0.02}
    Path(settings.out_dir).mkdir(parents=True)
    (Path(settings.out_dir) / "demo.json").write_text(json.dumps({"before": before, "after": {}, "step": 15}))
    for seed in settings.seeds:
        for arm, shift in (("GRPO", 0.0), ("F-GRPO", 0.05)):
            folder = run_dir(settings, seed, arm)
            log_run(folder, {2: 0.1 + shift, 4: 0.2 + shift + seed / 100}, [0.8, 0.7, 0.6, 0.5], [0.5] * 4)
            after = {"pass_at_1": 0.2 + shift + seed / 100, "pass_at_16": 0.5 + shift}
            (folder / "pass_at_k.json").write_text(json.dumps({"before": {}, "after": after, "step": 4}))
    path = tmp_path / "c.yaml"
    from dataclasses import asdict

    import yaml

    path.write_text(yaml.safe_dump(asdict(settings)))
    rare = {"pool": {"correct": 40, "sampled": 800, "top_fraction": 0.1},
            "summary": {"GRPO": {"n": 3, "mean": 0.25, "low": 0.1, "high": 0.4}},
            "tests": {"F-GRPO - GRPO": {"n": 3, "mean": -0.125, "low": -0.2, "high": -0.05}}}  # fmt: skip
    (Path(settings.out_dir) / "rare_nll.json").write_text(json.dumps(rare))
    assert main(["--config", str(path), "--report-only"]) == 0
    first = (Path(settings.out_dir) / "compare_report.md").read_text()
    assert "both 95 % t intervals above 0" in first and "| F-GRPO | 3 |" in first
    assert "Deviations from it: seed 3 validated once" in first
    assert "| before RL (`demo.json`) | 1 | 0.125 | 0.500 |" in first
    assert "| F-GRPO - GRPO | 3 | -0.125 [-0.200, -0.050] |" in first and "40 correct replies of 800" in first
    assert (Path(settings.out_dir) / "learning_curve.png").is_file()
    out = capsys.readouterr().out
    assert "logged to MLflow: runs:/" in out
    verdict = json.loads((Path(settings.out_dir) / "compare_verdict.json").read_text())
    assert verdict["preregistration"] == prereg and len(verdict["curves"]["GRPO"]) == 3
    assert main(["--config", str(path), "--report-only"]) == 0
    assert (Path(settings.out_dir) / "compare_report.md").read_text() == first
    import shutil

    shutil.copytree(settings.out_dir, tmp_path / "saved")  # as the runs' files are kept in docs/
    assert main(["--config", str(path), "--report-only", "--runs", str(tmp_path / "saved")]) == 0
    saved = (tmp_path / "saved" / "compare_report.md").read_text()
    assert saved == first.replace(settings.out_dir, str(tmp_path / "saved"))
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=settings.mlflow)
    runs = client.search_runs([client.get_experiment_by_name("lit-fgrpo compare").experiment_id])
    names = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    assert {"compare_report.md", "compare_verdict.json", "figures"} <= names
    assert not math.isnan(verdict["tests"]["F-GRPO - GRPO"]["pass_at_1"]["mean"])
