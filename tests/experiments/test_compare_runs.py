"""``lit-fgrpo compare``: the statistics against closed forms, and a real 2-arm run of the smoke maze config."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from lit_fgrpo.cli import main
from lit_fgrpo.experiments import compare_runs
from lit_fgrpo.experiments.compare_runs import CompareSettings, analyse, collect, load_settings, render, run_dir

ROOT = Path(__file__).resolve().parents[2]
T_975_DF2 = 4.302652729911275  # Student's t quantile 0.975 with 2 degrees of freedom


def settings(tmp: Path, **kw: object) -> CompareSettings:
    base = dict(
        fit_configs=[str(ROOT / "configs" / "maze_tiny.yaml")],
        arms={"GRPO": ["--model.objective.gamma", "0"], "F-GRPO": ["--model.objective.gamma", "0.5"]},
        baseline="GRPO",
        seeds=[1, 2, 3],
        out_dir=str(tmp),
    )
    return CompareSettings(**(base | kw))  # type: ignore[arg-type]


def write_result(s: CompareSettings, seed: int, arm: str, p1: float, p4: float) -> None:
    folder = run_dir(s, seed, arm)
    folder.mkdir(parents=True)
    result = {"before": {"pass_at_1": 0.1, "pass_at_4": 0.3}, "after": {"pass_at_1": p1, "pass_at_4": p4}, "step": 4}
    (folder / "pass_at_k.json").write_text(json.dumps(result))


def test_analyse_matches_closed_forms(tmp_path: Path) -> None:
    s = settings(tmp_path)
    grpo = {1: (0.30, 0.50), 2: (0.40, 0.55), 3: (0.35, 0.60)}
    focal = {1: (0.36, 0.62), 2: (0.47, 0.66), 3: (0.41, 0.71)}  # +0.06..0.07 pass@1, +0.11..0.12 pass@4
    for seed in s.seeds:
        write_result(s, seed, "GRPO", *grpo[seed])
        write_result(s, seed, "F-GRPO", *focal[seed])
    result = analyse(s, collect(s))
    diffs = [focal[k][0] - grpo[k][0] for k in s.seeds]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    test = result["tests"]["F-GRPO - GRPO"]["pass_at_1"]
    assert test["mean"] == pytest.approx(mean)
    assert test["low"] == pytest.approx(mean - T_975_DF2 * sd / math.sqrt(3))
    assert test["high"] == pytest.approx(mean + T_975_DF2 * sd / math.sqrt(3))
    assert result["summary"]["GRPO"]["pass_at_4"]["mean"] == pytest.approx(0.55)
    assert result["before_rl"]["pass_at_1"]["n"] == 6
    assert result["verdicts"]["F-GRPO - GRPO"] == "supported"  # both CIs above 0


def test_fewer_than_three_seeds_is_interim(tmp_path: Path) -> None:
    s = settings(tmp_path, seeds=[1, 2])
    for seed in s.seeds:
        write_result(s, seed, "GRPO", 0.3, 0.5)
        write_result(s, seed, "F-GRPO", 0.4, 0.7 + seed / 100)
    assert analyse(s, collect(s))["verdicts"]["F-GRPO - GRPO"] == "undecided (interim)"


def test_bad_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("fit_configs: [configs/maze_tiny.yaml]\narms: {A: []}\nbaseline: B\nseeds: [1]\nout_dir: x\n")
    assert main(["compare", "--config", str(path)]) == 2
    assert "baseline 'B' is not one of the arms ['A']" in capsys.readouterr().err
    path.write_text("fit_configs: [nope.yaml]\narms: {A: []}\nbaseline: A\nseeds: [1]\nout_dir: x\nextra: 1\n")
    assert main(["compare", "--config", str(path)]) == 2
    assert "unexpected keyword argument 'extra'" in capsys.readouterr().err


def test_compare_configs_parse() -> None:
    for path in sorted((ROOT / "configs" / "compare").glob("*.yaml")):
        s = load_settings(str(path))
        assert len(s.seeds) >= 3 and (s.baseline is None or s.baseline in s.arms)  # None: a pilot


def test_without_a_baseline_each_arm_is_summarised_with_its_own_before_row(tmp_path: Path) -> None:
    s = settings(tmp_path, baseline=None)
    for seed in s.seeds:
        write_result(s, seed, "GRPO", 0.3 + seed / 100, 0.5)
        folder = run_dir(s, seed, "F-GRPO")
        folder.mkdir(parents=True)
        (folder / "pass_at_k.json").write_text(
            json.dumps({"before": {}, "after": {"pass_at_1": 0.4, "pass_at_4": 0.6}})
        )
    result = analyse(s, collect(s))
    assert result["tests"] == {} and result["verdicts"] == {}
    assert result["before_rl_by_arm"]["GRPO"]["pass_at_1"]["n"] == 3
    assert result["before_rl_by_arm"]["F-GRPO"]["pass_at_1"]["n"] == 0
    text = render(result, s)
    assert "| GRPO, before RL | 3 | 0.100 [0.100, 0.100] |" in text and "| GRPO | 3 | 0.320 [" in text
    assert "F-GRPO, before RL" not in text and "| F-GRPO | 3 | 0.400 [" in text  # no before-RL runs: no row
    assert "comparison (A - B)" not in text and "H1" not in text


def test_each_finished_run_records_its_wall_clock_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_all`` on stand-in fit processes (a Python one-liner writing the results) that take about 0.3 s each."""
    s = settings(tmp_path, seeds=[1], parallel=2)

    def fake_fit(settings: CompareSettings, seed: int, arm: str) -> list[str]:
        out = run_dir(settings, seed, arm) / "pass_at_k.json"
        result = {"before": {}, "after": {"pass_at_1": 0.5}}
        return [
            sys.executable,
            "-c",
            f"import time; time.sleep(0.3); open({str(out)!r}, 'w').write({json.dumps(result)!r})",
        ]

    monkeypatch.setattr(compare_runs, "fit_command", fake_fit)
    compare_runs.run_all(s)
    for arm in s.arms:
        record = json.loads((run_dir(s, 1, arm) / compare_runs.RUN_RECORD).read_text())
        assert 0.3 <= record["seconds"] < 60 and record["parallel"] == 2


@pytest.mark.slow
def test_two_real_fit_runs_and_their_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two arms of the smoke maze config, 1 seed, run side by side as real ``lit-fgrpo fit`` processes."""
    s = settings(tmp_path / "runs", seeds=[7], parallel=2, fit_args=["--trainer.max_steps", "2", "--trainer.logger",
                 "false", "--trainer.val_check_interval", "2"])  # fmt: skip
    path = tmp_path / "c.yaml"
    from dataclasses import asdict

    import yaml

    path.write_text(yaml.safe_dump(asdict(s)))
    assert main(["compare", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "compare: run 2/2" in out and "| F-GRPO - GRPO | pass_at_1 | 1 |" in out
    for arm in s.arms:
        result = json.loads((run_dir(s, 7, arm) / "pass_at_k.json").read_text())
        assert result["step"] == 2 and 0 <= result["after"]["pass_at_1"] <= 1
    assert (Path(s.out_dir) / "compare_report.md").is_file()
    # A second call starts nothing: both runs are done.
    assert main(["compare", "--config", str(path)]) == 0
    assert "2 of 2 runs already done, 0 to go" in capsys.readouterr().out
