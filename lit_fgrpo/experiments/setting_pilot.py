"""The pre-registered pilot rule (issue 50): which GRPO-only candidate setting a real-model comparison runs on.

A pilot is a ``lit-fgrpo compare`` file with ``baseline: null`` whose arms are the candidates (GRPO, each a task and
a setting, e.g. ``configs/compare/smollm2_pilot.yaml``) and whose ``preregistration.rule_settings`` holds this rule's
numbers (:class:`RuleSettings`), committed before the first run. A candidate passes when, over its seeds:

- **the premise** is there: the task's base model covers some but not all held-out questions at the largest k,
  GRPO raises pass@1, and its gain at the largest k is a small share of the room it had (:func:`coverage_share`);
- **the seeds agree**: sqrt(2) x the seed sd of held-out pass@1 and of pass@k_max after RL (the paired difference's
  sd when the two arms of a seed vary independently) is small enough that the target MDE is reachable;
- **a run is short**: its median wall-clock time, as run in the pilot, is below the limit.

Of those that pass, the rule picks the one whose comparison reaches the target MDE soonest (projected pairs x
minutes per pair); none passing is a result too. Reads each run's ``pass_at_k.json`` and ``compare_run.json``::

    python -m lit_fgrpo.experiments.setting_pilot --config configs/compare/smollm2_pilot.yaml [--runs DIR]

Writes ``pilot_report.md`` and ``pilot_verdict.json`` into the runs' folder.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.experiments.compare_runs import RUN_RECORD, CompareSettings, collect, load_settings, run_dir
from lit_fgrpo.experiments.evidence_stats import FINAL_SEEDS, MIN_SEEDS, t_quantile

FLAG = "preregistration.rule_settings"
"""Where a pilot file keeps :class:`RuleSettings`."""


@dataclass(frozen=True)
class RuleSettings:
    """The pilot rule's numbers (a compare file's ``preregistration.rule_settings``)."""

    tasks: dict[str, list[str]]
    """Task name -> its candidates (arm names); every arm in exactly one. A task's base-model pass@k is the mean over
    the runs of its candidates that validated before RL (``--rollout.validate_at_start true``)."""
    base_coverage: tuple[float, float] = (0.2, 0.9)
    """The base model's held-out pass@k_max must lie in this range: coverage real, and room to lose or gain it."""
    min_pass1_gain: float = 0.05
    """GRPO must raise held-out pass@1 by at least this (mean over seeds)."""
    max_coverage_share: float = 0.5
    """Premise: :func:`coverage_share` at most this (at least 1 when RL improves every question evenly; < 0: a drop)."""
    max_paired_sd: float = 0.07
    """sqrt(2) x the larger seed sd of held-out pass@1 and pass@k_max after RL must be at most this."""
    target_mde: float = 0.05
    """The comparison's aim: the pairs it needs are the fewest whose MDE at that paired sd is at most this."""
    max_minutes_per_run: float = 30.0
    """A candidate's median run, as the pilot ran it (``parallel`` at once), must take at most this many minutes."""

    def __post_init__(self) -> None:
        low, high = (float(v) for v in self.base_coverage)
        if not 0 <= low < high <= 1:
            raise ConfigError(f"{FLAG}.base_coverage must be [low, high] with 0 <= low < high <= 1, got {low}, {high}")
        object.__setattr__(self, "base_coverage", (low, high))
        for name in ("max_paired_sd", "target_mde", "max_minutes_per_run"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{FLAG}.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Judgement:
    """One candidate against the rule: its numbers, which parts it passes, and why not."""

    arm: str
    task: str
    seeds: int
    base: dict[str, float]
    """The task's base model, metric -> held-out value (empty: no run of the task validated before RL)."""
    after: dict[str, float]
    """Mean over seeds after RL."""
    sd: dict[str, float]
    """Seed sd after RL (NaN below 2 seeds)."""
    coverage_share: float | None
    paired_sd: float
    pairs_needed: int | None
    minutes_per_run: float | None
    hours_to_target: float | None
    """Projected wall-clock hours of the comparison at the target MDE: pairs x minutes per pair."""
    failures: list[str] = field(default_factory=list)

    @property
    def passes(self) -> bool:
        """Every part of the rule holds."""
        return not self.failures


def rule_settings(settings: CompareSettings) -> RuleSettings:
    """The rule's settings of a pilot file, each arm in exactly one task.

    Raises:
        ConfigError: the block is missing, has an unknown key, or the tasks do not partition the arms.
    """
    if settings.baseline is not None:
        raise ConfigError(f"pilot: baseline must be null (a pilot compares nothing), got {settings.baseline!r}")
    raw = settings.preregistration.get("rule_settings")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"pilot: {FLAG} must be a mapping with tasks: {{task: [arm, ...]}}")
    try:
        rule = RuleSettings(**raw)
    except TypeError as err:
        raise ConfigError(f"pilot: {FLAG}: {err}") from None
    named = [arm for arms in rule.tasks.values() for arm in arms]
    if sorted(named) != sorted(settings.arms):
        raise ConfigError(f"pilot: {FLAG}.tasks must name every arm once; arms {sorted(settings.arms)}, named {named}")
    return rule


def coverage_share(base: Mapping[str, float], after: Mapping[str, float], top: str) -> float | None:
    """(gain at ``top`` / its room) / (gain at pass@1 / its room); None when pass@1 did not rise or ``top`` had no room.

    If RL scaled every question's failure probability by the same c, the share would be (1 - c^k) / (1 - c) >= 1:
    a share well below 1 means the gain went to questions the base already covered (sharpening), below 0 a drop.
    """
    gain1, gaink = after["pass_at_1"] - base["pass_at_1"], after[top] - base[top]
    if gain1 <= 0 or base[top] >= 1 or base["pass_at_1"] >= 1:
        return None
    return (gaink / (1 - base[top])) / (gain1 / (1 - base["pass_at_1"]))


def pairs_needed(paired_sd: float, target: float, cap: int = 10_000) -> int | None:
    """The fewest seed pairs (at least ``FINAL_SEEDS``) whose MDE (t(.975) + t(.80)) * sd / sqrt(n) is <= target.

    None if not even ``cap`` pairs reach it (or the sd is not a number).
    """
    if math.isnan(paired_sd):
        return None
    n = FINAL_SEEDS
    while (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * paired_sd / math.sqrt(n) > target:
        n += 1
        if n > cap:
            return None
    return n


def task_bases(
    rows: Mapping[str, Mapping[int, Mapping[str, float]]], rule: RuleSettings
) -> dict[str, dict[str, float]]:
    """Task -> metric -> the mean base-model value over the task's runs that validated before RL."""
    bases: dict[str, dict[str, float]] = {}
    for task, arms in rule.tasks.items():
        starts = [r for arm in arms for r in rows.get(arm, {}).values() if "start_pass_at_1" in r]
        keys = {k for r in starts for k in r if k.startswith("start_")}
        bases[task] = {k[len("start_") :]: statistics.fmean(r[k] for r in starts if k in r) for k in keys}
    return bases


def judge(
    arm: str,
    task: str,
    runs: Mapping[int, Mapping[str, float]],
    base: Mapping[str, float],
    minutes: Sequence[float],
    rule: RuleSettings,
    top: str,
    parallel: int = 2,
) -> Judgement:
    """``arm``'s seeds (seed -> after-RL metrics) against the rule; ``minutes``: its runs' wall-clock minutes."""
    metrics = ("pass_at_1", top)
    after = {m: statistics.fmean(r[m] for r in runs.values()) for m in metrics} if runs else {}
    sd = {m: statistics.stdev(r[m] for r in runs.values()) if len(runs) > 1 else math.nan for m in metrics}
    paired_sd = math.sqrt(2) * max(sd.values())
    pairs = pairs_needed(paired_sd, rule.target_mde)
    per_run = statistics.median(minutes) if minutes else None
    hours = pairs * 2 * per_run / parallel / 60 if pairs is not None and per_run is not None else None
    share = coverage_share(base, after, top) if after and set(metrics) <= set(base) else None
    failures = []
    if len(runs) < MIN_SEEDS:
        failures.append(f"interim: {len(runs)} of {MIN_SEEDS} seeds")
    if set(metrics) - set(base):
        failures.append("no base: no run of the task validated before RL")
    elif not rule.base_coverage[0] <= base[top] <= rule.base_coverage[1]:
        failures.append(f"base {top} {base[top]:.3f} outside {list(rule.base_coverage)}")
    if after and set(metrics) <= set(base):
        if after["pass_at_1"] - base["pass_at_1"] < rule.min_pass1_gain:
            failures.append(f"pass@1 gain {after['pass_at_1'] - base['pass_at_1']:+.3f} < {rule.min_pass1_gain}")
        elif share is None or share > rule.max_coverage_share:
            failures.append(f"coverage share {_num(share)} > {rule.max_coverage_share}")
    if not paired_sd <= rule.max_paired_sd:
        failures.append(f"paired sd {_num(paired_sd)} > {rule.max_paired_sd}")
    if per_run is None or per_run > rule.max_minutes_per_run:
        failures.append(f"minutes per run {_num(per_run, '.1f')} > {rule.max_minutes_per_run}")
    return Judgement(arm, task, len(runs), dict(base), after, sd, share, paired_sd, pairs, per_run, hours, failures)


def choose(judgements: Sequence[Judgement]) -> str | None:
    """The passing candidate with the fewest projected hours to the target MDE (ties: the name); None if none."""
    passing = [j for j in judgements if j.passes and j.hours_to_target is not None]
    return min(passing, key=lambda j: (j.hours_to_target, j.arm)).arm if passing else None


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def render(judgements: Sequence[Judgement], chosen: str | None, top: str, rule: RuleSettings) -> str:
    """The pilot's table (one row per candidate) and the rule's choice, in markdown."""
    lines = [
        f"| candidate | seeds | base pass@1 / {top} | after pass@1 / {top} | coverage share | sd pass@1 / {top} "
        "| paired sd | pairs to MDE | min/run | hours | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for j in judgements:
        base = f"{_num(j.base.get('pass_at_1'))} / {_num(j.base.get(top))}"
        after = f"{_num(j.after.get('pass_at_1'))} / {_num(j.after.get(top))}"
        sds = f"{_num(j.sd.get('pass_at_1'))} / {_num(j.sd.get(top))}"
        verdict = "passes" if j.passes else "; ".join(j.failures)
        lines.append(f"| {j.arm} | {j.seeds} | {base} | {after} | {_num(j.coverage_share, '+.2f')} | {sds} | "
                     f"{_num(j.paired_sd)} | {j.pairs_needed or '-'} | {_num(j.minutes_per_run, '.1f')} | "
                     f"{_num(j.hours_to_target, '.1f')} | {verdict} |")  # fmt: skip
    pick = f"**{chosen}**" if chosen else "**none**: no candidate meets every part of the rule"
    lines += ["", f"Chosen by the pre-registered rule: {pick} (target MDE {rule.target_mde}, paired sd at most "
              f"{rule.max_paired_sd}, coverage share at most {rule.max_coverage_share}).", ""]  # fmt: skip
    return "\n".join(lines)


def run_minutes(settings: CompareSettings, arm: str) -> list[float]:
    """The wall-clock minutes of ``arm``'s finished runs that recorded them (``compare_run.json``)."""
    paths = (run_dir(settings, seed, arm) / RUN_RECORD for seed in settings.seeds)
    return [json.loads(p.read_text())["seconds"] / 60 for p in paths if p.is_file()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lit_fgrpo.experiments.setting_pilot --config PILOT.yaml [--runs DIR]``: the table and the choice."""
    parser = argparse.ArgumentParser(prog="setting_pilot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the pilot's compare file (baseline: null, rule_settings)")
    parser.add_argument("--runs", help="the runs' folder instead of the file's out_dir (e.g. a saved copy in docs/)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        settings = load_settings(args.config)
        settings = replace(settings, out_dir=args.runs) if args.runs else settings
        rule = rule_settings(settings)
    except ConfigError as err:
        print(f"setting_pilot: error: {err}", file=sys.stderr)
        return 2
    rows = collect(settings)
    keys = sorted({k for per in rows.values() for r in per.values() for k in r if k.startswith("pass_at_")},
                  key=lambda k: int(k.rsplit("_", 1)[1]))  # fmt: skip
    if not keys:
        print(f"setting_pilot: error: no finished run under {settings.out_dir}", file=sys.stderr)
        return 2
    top, bases = keys[-1], task_bases(rows, rule)
    judgements = [judge(arm, task, rows[arm], bases[task], run_minutes(settings, arm), rule, top, settings.parallel)
                  for task, arms in rule.tasks.items() for arm in arms]  # fmt: skip
    chosen = choose(judgements)
    text = render(judgements, chosen, top, rule)
    out = Path(settings.out_dir)
    (out / "pilot_report.md").write_text(text)
    verdict = {"chosen": chosen, "top": top, "rule_settings": asdict(rule),
               "candidates": [asdict(j) | {"passes": j.passes} for j in judgements]}  # fmt: skip
    (out / "pilot_verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
