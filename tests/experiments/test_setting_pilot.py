"""The pre-registered pilot rule (issue 50): closed forms, a synthetic pilot end to end, and the committed pilot file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy import stats

from lit_fgrpo.cli import main as cli_main
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.experiments.compare_runs import CompareSettings, load_settings, run_dir, write_run_record
from lit_fgrpo.experiments.setting_pilot import coverage_share, main, pairs_needed, rule_settings

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "configs" / "compare" / "smollm2_pilot.yaml"
COMPARISON = ROOT / "configs" / "compare" / "smollm2_k64_warmup.yaml"
PILOT_K64 = ROOT / "configs" / "compare" / "smollm2_pilot_k64.yaml"
RULE = {"tasks": {"easy": ["easy a", "easy b"], "hard": ["hard a", "hard b", "hard c"]}}


def test_coverage_share_of_an_even_improvement_is_its_closed_form() -> None:
    """Every question's failure probability times c: the share is (1 - c^16) / (1 - c), whatever the questions."""
    p = np.random.default_rng(0).uniform(0.0, 0.6, size=500)  # (questions,) base success probabilities
    for c in (0.3, 0.7, 0.95):
        q = 1 - c * (1 - p)
        base = {"pass_at_1": p.mean(), "pass_at_16": (1 - (1 - p) ** 16).mean()}
        after = {"pass_at_1": q.mean(), "pass_at_16": (1 - (1 - q) ** 16).mean()}
        assert coverage_share(base, after, "pass_at_16") == pytest.approx((1 - c**16) / (1 - c))


def test_coverage_share_of_the_demo_and_of_a_drop() -> None:
    base = {"pass_at_1": 0.119, "pass_at_16": 0.648}  # the demo's base model, GRPO's mean over 7 seeds after RL
    assert coverage_share(base, {"pass_at_1": 0.657, "pass_at_16": 0.808}, "pass_at_16") == pytest.approx(
        (0.160 / 0.352) / (0.538 / 0.881)
    )
    assert coverage_share(base, {"pass_at_1": 0.3, "pass_at_16": 0.6}, "pass_at_16") < 0  # coverage lost
    assert coverage_share(base, {"pass_at_1": 0.1, "pass_at_16": 0.7}, "pass_at_16") is None  # pass@1 fell


@pytest.mark.parametrize("sd", [0.03, 0.05, 0.07, 0.1, 0.19])
def test_pairs_needed_is_the_first_n_whose_t_mde_reaches_the_target(sd: float) -> None:
    def mde(n: int) -> float:  # reference: SciPy's t quantiles
        return float((stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n))

    n = pairs_needed(sd, 0.05)
    assert n is not None and mde(n) <= 0.05
    assert n == 5 or mde(n - 1) > 0.05  # the fewest, at least 5 (FINAL_SEEDS)
    assert pairs_needed(0.07, 0.05) == 18 and pairs_needed(1.0, 0.05, cap=100) is None


def pilot(tmp: Path, **kw: object) -> CompareSettings:
    arms = {arm: [] for arms in RULE["tasks"].values() for arm in arms}
    base = dict(fit_configs=[str(ROOT / "configs" / "maze_tiny.yaml")], arms=arms, baseline=None, seeds=[1, 2, 3],
                out_dir=str(tmp), parallel=2, preregistration={"rule_settings": RULE})  # fmt: skip
    return CompareSettings(**(base | kw))  # type: ignore[arg-type]


def write_run(
    s: CompareSettings,
    seed: int,
    arm: str,
    p1: float,
    p16: float,
    minutes: float,
    base: tuple[float, float] | None = None,
) -> None:
    folder = run_dir(s, seed, arm)
    folder.mkdir(parents=True)
    before = {"pass_at_1": base[0], "pass_at_16": base[1]} if base else {}
    (folder / "pass_at_k.json").write_text(
        json.dumps({"before": before, "after": {"pass_at_1": p1, "pass_at_16": p16}})
    )
    write_run_record(folder, minutes * 60, s.parallel)


def test_a_synthetic_pilot_is_judged_and_the_cheapest_passing_candidate_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = pilot(tmp_path / "runs")
    for i, seed in enumerate(s.seeds):
        d = (i - 1) * 0.02  # seed offsets -0.02, 0, +0.02: sd 0.02
        # easy: base 0.5 / 0.95 (saturated); hard: base 0.1 / 0.5, validated in the "a" runs only
        write_run(s, seed, "easy a", 0.8 + d, 0.96 + d / 2, 10, base=(0.5, 0.95))
        write_run(s, seed, "easy b", 0.8 + d, 0.96 + d / 2, 10)
        write_run(s, seed, "hard a", 0.35 + d, 0.52 + d, 12, base=(0.1 + d, 0.5 - d))  # share 0.14: sharpens
        write_run(s, seed, "hard b", 0.35 + 5 * d, 0.52 + 5 * d, 8)  # sd 0.1: seeds disagree
        write_run(s, seed, "hard c", 0.35 + d, 0.52 + d, 40)  # a run of 40 minutes
    assert main(["--config", str(write_yaml(s, tmp_path))]) == 0
    verdict = json.loads((Path(s.out_dir) / "pilot_verdict.json").read_text())
    assert verdict["chosen"] == "hard a" and verdict["top"] == "pass_at_16"
    by_arm = {c["arm"]: c for c in verdict["candidates"]}
    hard = by_arm["hard a"]
    assert hard["base"] == pytest.approx({"pass_at_1": 0.1, "pass_at_16": 0.5})  # the mean of the a runs' before
    assert hard["coverage_share"] == pytest.approx((0.02 / 0.5) / (0.25 / 0.9))
    assert hard["paired_sd"] == pytest.approx(math.sqrt(2) * 0.02)
    assert hard["pairs_needed"] == 5 and hard["hours_to_target"] == pytest.approx(5 * 12 / 60)
    assert by_arm["easy b"]["failures"] == ["base pass_at_16 0.950 outside [0.2, 0.9]"]
    assert by_arm["hard b"]["failures"] == ["paired sd 0.141 > 0.07"]
    assert by_arm["hard c"]["failures"] == ["minutes per run 40.0 > 30.0"]
    out = capsys.readouterr().out
    assert "Chosen by the pre-registered rule: **hard a**" in out and "| hard b | 3 |" in out


def test_a_sharpening_premise_missing_and_too_few_seeds_choose_none(tmp_path: Path) -> None:
    s = pilot(tmp_path / "runs", seeds=[1, 2])
    for seed in s.seeds:
        for arm in ("easy a", "easy b", "hard b", "hard c"):
            write_run(s, seed, arm, 0.3, 0.6, 5, base=(0.1, 0.5))
        write_run(s, seed, "hard a", 0.3 + seed / 100, 0.9, 5, base=(0.1, 0.5))  # pass@16 gains the most
    assert main(["--config", str(write_yaml(s, tmp_path))]) == 0
    verdict = json.loads((Path(s.out_dir) / "pilot_verdict.json").read_text())
    assert verdict["chosen"] is None
    failures = {c["arm"]: c["failures"] for c in verdict["candidates"]}
    assert failures["hard a"][0] == "interim: 2 of 3 seeds" and failures["hard a"][1].startswith("coverage share 3.3")


def write_yaml(s: CompareSettings, tmp: Path) -> Path:
    from dataclasses import asdict

    path = tmp / "pilot.yaml"
    path.write_text(yaml.safe_dump(asdict(s)))
    return path


def test_bad_rule_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="baseline must be null"):
        rule_settings(pilot(tmp_path, baseline="easy a"))
    with pytest.raises(ConfigError, match="tasks must name every arm once"):
        rule_settings(pilot(tmp_path, preregistration={"rule_settings": {"tasks": {"easy": ["easy a"]}}}))
    with pytest.raises(ConfigError, match="unexpected keyword argument 'max_sd'"):
        rule_settings(pilot(tmp_path, preregistration={"rule_settings": RULE | {"max_sd": 0.1}}))
    with pytest.raises(ConfigError, match=r"rule_settings.base_coverage must be \[low, high\]"):
        rule_settings(pilot(tmp_path, preregistration={"rule_settings": RULE | {"base_coverage": [0.9, 0.2]}}))
    assert main(["--config", str(write_yaml(pilot(tmp_path, preregistration={}), tmp_path))]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_committed_pilot_file() -> None:
    s = load_settings(str(PILOT))
    rule = rule_settings(s)  # every arm in one task
    assert s.baseline is None and len(s.seeds) == 3 and len(s.arms) == 12
    power = load_settings(str(PILOT.parent / "smollm2_power.yaml"))
    assert min(s.seeds) > max(power.seeds)  # the pilot's seeds are never a comparison's (those start at 1)
    assert (rule.max_paired_sd, rule.target_mde) == (0.07, 0.05)
    written = s.preregistration["written"]
    assert written.startswith("2026-12-05 11:14 UTC")
    for flags in s.arms.values():
        assert "--model.objective.gamma" not in flags  # GRPO from fit_args in every candidate
        for path in (flags[i + 1] for i, word in enumerate(flags) if word == "--config"):
            assert (ROOT / path).is_file(), path


def test_the_second_pilot_file() -> None:
    """Pilot 2 (pre-registered after pilot 1 chose none): the demo's sums judged at k = 64, seeds of its own."""
    s, first = load_settings(str(PILOT_K64)), load_settings(str(PILOT))
    rule = rule_settings(s)
    power = load_settings(str(PILOT.parent / "smollm2_power.yaml"))
    assert s.baseline is None and len(s.seeds) == 3 and set(rule.tasks) == {"sums"} and len(s.arms) == 3
    assert not set(s.seeds) & (set(first.seeds) | set(power.seeds))
    assert rule.base_coverage == (0.2, 0.95) and (rule.max_paired_sd, rule.target_mde) == (0.07, 0.05)
    assert s.preregistration["written"].startswith("2026-12-06 19:02 UTC")
    assert "configs/smollm2/pilot_k64.yaml" in s.fit_configs and "--model.objective.gamma" in s.fit_args


@pytest.mark.parametrize("arm", ["sum3 steady", "carry demo"])
def test_pilot_candidates_resolve_to_their_settings(arm: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The arm's overlays come after the pilot's fit_args on the command line and override them where they overlap."""
    config = resolved(load_settings(str(PILOT)), arm, capsys)
    model, data, rollout = config["model"], config["data"], config["rollout"]
    assert model["objective"]["gamma"] == 0.0 and rollout["sampling"]["n"] == 8
    if arm == "sum3 steady":
        assert (config["trainer"]["max_steps"], config["trainer"]["val_check_interval"]) == (30, 30)
        assert (model["optimizer"]["lr"], model["optimizer"]["warmup_steps"], model["objective"]["beta"]) == (
            3e-4, 5, 0.04)  # fmt: skip
        assert (data["loader"]["prompts_per_step"], data["arithmetic"]["terms"]) == (16, 3)
        assert (rollout["sampling"]["max_tokens"], rollout["validate_at_start"]) == (22, False)
    else:
        assert (config["trainer"]["max_steps"], config["trainer"]["val_check_interval"]) == (15, 15)
        assert (data["arithmetic"]["min_value"], data["arithmetic"]["max_value"], data["arithmetic"]["terms"]) == (
            10, 99, 2)  # fmt: skip
        assert (model["optimizer"]["lr"], model["objective"]["beta"], rollout["validate_at_start"]) == (1e-3, 0, True)
    assert data["splits"]["num_train"] == 1024 and data["splits"]["num_val"] == 128


def resolved(s: CompareSettings, arm: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The fit config one run of ``arm`` of the compare file ``s`` resolves to (``--print_config``)."""
    words = ["fit"] + [w for c in s.fit_configs for w in ("--config", str(ROOT / c))] + s.fit_args
    words += [str(ROOT / w) if w.startswith("configs/") else w for w in s.arms[arm]]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*words, "--print_config"])
    assert exit_info.value.code in (0, None)
    config: dict[str, Any] = yaml.safe_load(capsys.readouterr().out)
    return config


def test_the_comparison_runs_pilot_2s_warmup_setting_with_two_gammas(capsys: pytest.CaptureFixture[str]) -> None:
    """configs/compare/smollm2_k64_warmup.yaml (pre-registered after pilot 2): each arm is pilot 2's "sums warmup"
    run with only the focal exponent changed; seeds from 1, 34 of them (the pairs pilot 2's sd asks for)."""
    s, pilot = load_settings(str(COMPARISON)), load_settings(str(PILOT_K64))
    assert s.baseline == "GRPO" and s.seeds == list(range(1, 35)) and "34 pairs" in s.preregistration["rule"]
    assert s.preregistration["written"].startswith("2026-12-07 19:53 UTC")
    candidate = resolved(pilot, "sums warmup", capsys)
    for arm, gamma in (("GRPO", 0.0), ("F-GRPO gamma 0.5", 0.5)):
        config = resolved(s, arm, capsys)
        assert config["model"]["objective"]["gamma"] == gamma
        config["model"]["objective"]["gamma"] = 0.0
        assert config == candidate, arm
