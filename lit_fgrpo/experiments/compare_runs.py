"""``lit-fgrpo compare``: arms x seeds of any fit config, each a real ``lit-fgrpo fit`` process, and their verdict.

The real-model counterpart of the maze sweep: the same pre-registered statistics
(:mod:`lit_fgrpo.experiments.evidence_stats`: 95 % t intervals over seeds, seed bootstrap, minimal detectable
effect, the H1 rule "both pass@1 and pass@k_max gain", at least 3 seeds for any verdict) on the before/after
``pass_at_k.json`` that :class:`~lit_fgrpo.callbacks.PassAtKReport` writes into each run's folder::

    lit-fgrpo compare --config configs/compare/smollm2_power.yaml

Each (seed, arm) run goes to ``out_dir/seed{s}/{arm}/`` (its log in ``fit.log``) with ``--seed_everything s
--rollout.seed s``: the arms of one seed share the LoRA initialisation, the questions and the held-out set, and
differ only in the arm's flags. A finished run is skipped, so rerunning the command continues an interrupted
comparison. ``parallel: 2`` runs two at once, each on one torch thread (on 2 cores two 1-thread runs beat one
2-thread run at this model size). Writes ``compare_report.md`` and ``compare_verdict.json``, and into each run's
folder its wall-clock time (``compare_run.json``). ``baseline: null`` compares nothing: each arm is summarised alone
(a pilot over candidate settings, :mod:`lit_fgrpo.experiments.setting_pilot`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from lit_fgrpo.errors import ConfigError, DataError
from lit_fgrpo.experiments.compare_curves import curve_figure, load_run, rare_nll_lines, training_table
from lit_fgrpo.experiments.evidence_stats import MIN_SEEDS, classify_gain, h1_verdict, paired
from lit_fgrpo.reporting.progress import format_duration

RESULTS = "pass_at_k.json"
RUN_RECORD = "compare_run.json"
"""Written into a run's folder when it ends: its wall-clock seconds and how many runs shared the machine."""


@dataclass(frozen=True)
class CompareSettings:
    """What to compare (a YAML file; every key is a field)."""

    fit_configs: list[str]
    """The fit configs every run uses, in order (``--config`` each)."""
    arms: dict[str, list[str]]
    """Arm name -> its extra fit flags, e.g. ``{"GRPO": ["--model.objective.gamma", "0"]}``."""
    baseline: str | None
    """The arm the others are compared with (A - baseline); None: no comparison, each arm summarised alone with its
    own before-RL row (a pilot over candidate settings, :mod:`lit_fgrpo.experiments.setting_pilot`)."""
    seeds: list[int]
    """Seeds; each sets ``--seed_everything`` and ``--rollout.seed``."""
    out_dir: str
    """Where the runs and the report go."""
    fit_args: list[str] = field(default_factory=list)
    """Flags for every run (after the configs, before the arm's)."""
    delta: float = 0.03
    """Smallest effect of interest (the maze test's)."""
    parallel: int = 1
    """Runs at once (each on ``torch threads = cores / parallel``)."""
    preregistration: dict[str, Any] = field(default_factory=dict)
    """What was fixed before any run (metrics, seeds, the rule, the minimum detectable effect aimed at): written at
    the top of the report and into the verdict file, unchanged."""
    base_results: str | None = None
    """A ``pass_at_k.json`` (relative to ``out_dir``) whose ``before`` column is the base model's held-out pass@k on
    the same questions and samples (e.g. a copy of the demo run's), for runs that skip their own
    (``--rollout.validate_at_start false``): the report's "before RL" row and the learning curves' step 0 (None: the
    runs' own before columns)."""
    deviations: str = ""
    """What changed after the runs began, and why (written under the pre-registration in the report)."""
    mlflow: str | None = None
    """An MLflow tracking URI (e.g. ``sqlite:///mlflow.db``): the report, the verdict and the learning-curve figure
    are logged there as one run of the experiment ``lit-fgrpo compare`` (None: files only)."""

    def __post_init__(self) -> None:
        if self.baseline is not None and self.baseline not in self.arms:
            raise ConfigError(f"compare: baseline {self.baseline!r} is not one of the arms {sorted(self.arms)}")
        if not self.seeds or self.parallel < 1:
            raise ConfigError("compare: seeds must be non-empty and parallel >= 1")
        for path in self.fit_configs:
            if not Path(path).is_file():
                raise ConfigError(f"compare: fit_configs: no such file {path}")


def slug(name: str) -> str:
    """A folder name for an arm: ``F-GRPO gamma 0.5`` -> ``F-GRPO_gamma_0.5``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def run_dir(settings: CompareSettings, seed: int, arm: str) -> Path:
    """The folder of one run."""
    return Path(settings.out_dir) / f"seed{seed}" / slug(arm)


def fit_command(settings: CompareSettings, seed: int, arm: str) -> list[str]:
    """The ``lit-fgrpo fit`` command line of one run."""
    words = [sys.executable, "-m", "lit_fgrpo.cli", "fit"]
    for config in settings.fit_configs:
        words += ["--config", config]
    words += [*settings.fit_args, *settings.arms[arm]]
    words += ["--seed_everything", str(seed), "--rollout.seed", str(seed)]
    return words + ["--trainer.default_root_dir", str(run_dir(settings, seed, arm))]


def _start(settings: CompareSettings, seed: int, arm: str) -> subprocess.Popen[bytes]:
    folder = run_dir(settings, seed, arm)
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LIT_FGRPO_PROGRESS="lines")
    if settings.parallel > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // settings.parallel))
    log = open(folder / "fit.log", "wb")  # noqa: SIM115  # closed with the process (below)
    process = subprocess.Popen(fit_command(settings, seed, arm), stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    return process


def run_all(settings: CompareSettings) -> None:
    """Run every unfinished (seed, arm), ``parallel`` at a time, reporting each as it ends.

    Raises:
        DataError: a run failed (its log file is named); the finished ones are kept.
    """
    units = [(s, a) for s in settings.seeds for a in settings.arms]
    todo = [(s, a) for s, a in units if not (run_dir(settings, s, a) / RESULTS).is_file()]
    print(f"compare: {len(units) - len(todo)} of {len(units)} runs already done, {len(todo)} to go", flush=True)
    running: list[tuple[int, str, float, subprocess.Popen[bytes]]] = []
    done = len(units) - len(todo)
    while todo or running:
        while todo and len(running) < settings.parallel:
            seed, arm = todo.pop(0)
            running.append((seed, arm, time.perf_counter(), _start(settings, seed, arm)))
        time.sleep(2)
        for unit in list(running):
            seed, arm, start, process = unit
            if process.poll() is None:
                continue
            running.remove(unit)
            if process.returncode != 0:
                for _, _, _, other in running:
                    other.terminate()
                log = run_dir(settings, seed, arm) / "fit.log"
                raise DataError(f"compare: seed {seed} arm {arm!r} failed (exit {process.returncode}); see {log}")
            done += 1
            seconds = time.perf_counter() - start
            write_run_record(run_dir(settings, seed, arm), seconds, settings.parallel)
            result = json.loads((run_dir(settings, seed, arm) / RESULTS).read_text())
            before, after = result["before"].get("pass_at_1"), result["after"].get("pass_at_1")
            change = f"{before:.3f} -> {after:.3f}" if before is not None else f"{after:.3f}"
            print(
                f"compare: run {done}/{len(units)} seed {seed} {arm}: pass@1 {change} in {format_duration(seconds)}",
                flush=True,
            )


def write_run_record(folder: Path, seconds: float, parallel: int) -> None:
    """Record a finished run's wall-clock time (``seconds``, with ``parallel`` runs at once) in its folder."""
    record = {"seconds": round(seconds, 1), "parallel": parallel, "cpus": os.cpu_count()}
    (folder / RUN_RECORD).write_text(json.dumps(record) + "\n")


def collect(settings: CompareSettings) -> dict[str, dict[int, dict[str, float]]]:
    """Arm -> seed -> after-RL metrics (plus ``start_*`` before RL) of every finished run."""
    rows: dict[str, dict[int, dict[str, float]]] = {arm: {} for arm in settings.arms}
    for arm in settings.arms:
        for seed in settings.seeds:
            path = run_dir(settings, seed, arm) / RESULTS
            if path.is_file():
                result = json.loads(path.read_text())
                rows[arm][seed] = result["after"] | {f"start_{k}": v for k, v in result["before"].items()}
    return rows


def analyse(settings: CompareSettings, rows: dict[str, dict[int, dict[str, float]]]) -> dict[str, Any]:
    """Per-arm means with 95 % t intervals, paired differences to the baseline and the H1 verdict per arm."""
    metrics = sorted({m for per in rows.values() for r in per.values() for m in r if m.startswith("pass_at_")},
                     key=lambda m: int(m.rsplit("_", 1)[1]))  # fmt: skip
    if not metrics:
        raise DataError(f"compare: no finished run under {settings.out_dir}")
    top = metrics[-1]
    summary = {arm: {m: asdict(paired([r[m] for r in per.values()])) for m in metrics} for arm, per in rows.items()}
    start = {m: asdict(paired([r[f"start_{m}"] for per in rows.values() for r in per.values() if f"start_{m}" in r]))
             for m in metrics}  # fmt: skip
    by_arm = {arm: {m: asdict(paired([r[f"start_{m}"] for r in per.values() if f"start_{m}" in r])) for m in metrics}
              for arm, per in rows.items()}  # fmt: skip
    base = rows[settings.baseline] if settings.baseline is not None else {}
    tests, verdicts = {}, {}
    for arm, per in rows.items():
        if settings.baseline is None or arm == settings.baseline:
            continue
        seeds = sorted(per.keys() & base.keys())
        diffs = {m: paired([per[s][m] - base[s][m] for s in seeds]) for m in metrics}
        name = f"{arm} - {settings.baseline}"
        tests[name] = {m: asdict(p) | {"class": classify_gain(p, settings.delta)} for m, p in diffs.items()}
        verdicts[name] = h1_verdict(diffs["pass_at_1"], diffs[top], settings.delta)
    return {"metrics": metrics, "summary": summary, "before_rl": start, "before_rl_by_arm": by_arm, "tests": tests,
            "verdicts": verdicts, "seeds": settings.seeds, "delta": settings.delta, "min_seeds": MIN_SEEDS}  # fmt: skip


def _ci(s: dict[str, Any], signed: bool = False) -> str:
    fmt = "{:+.3f}" if signed else "{:.3f}"
    if s["n"] == 0:
        return "-"
    if s["n"] < 2:
        return fmt.format(s["mean"])
    return f"{fmt.format(s['mean'])} [{fmt.format(s['low'])}, {fmt.format(s['high'])}]"


def render(result: dict[str, Any], settings: CompareSettings) -> str:
    """The markdown report."""
    metrics = result["metrics"]
    lines = []
    if settings.preregistration:
        lines += ["Pre-registered before the runs (the compare file's `preregistration`):", "",
                  "```", yaml.safe_dump(settings.preregistration, sort_keys=False, width=110).strip(), "```", ""]  # fmt: skip
    if settings.deviations:
        lines += [f"Deviations from it: {settings.deviations}", ""]
    lines += [f"Runs: `{settings.out_dir}`, seeds {settings.seeds}; configs {settings.fit_configs} "
             f"with {' '.join(settings.fit_args)}. Intervals: two-sided 95 % t over seeds.", "",
             "| arm | seeds | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]  # fmt: skip
    before = ("before RL (all runs)", result["before_rl"])
    if result.get("base"):
        base = {m: {"n": 1, "mean": v} for m, v in result["base"].items()}
        before = (f"before RL (`{settings.base_results}`)", base | {m: {"n": 0} for m in metrics if m not in base})
    rows = [before, *result["summary"].items()]
    if settings.baseline is None:  # arms of different tasks: each its own before-RL row, from its runs that had one
        rows = [row for arm, per in result["summary"].items()
                for row in ((f"{arm}, before RL", result["before_rl_by_arm"][arm]), (arm, per))
                if row[1][metrics[0]]["n"] > 0]  # fmt: skip
    for arm, per in rows:
        lines.append(f"| {arm} | {per[metrics[0]]['n']} | " + " | ".join(_ci(per[m]) for m in metrics) + " |")
    lines += comparison_lines(result) if result["tests"] else [""]
    for name, verdict in result["verdicts"].items():
        lines.append(f"**H1 ({name} gains in both pass@1 and {metrics[-1]}): {verdict}.** Smallest effect of "
                     f"interest {settings.delta}; a verdict needs at least {MIN_SEEDS} seeds.")  # fmt: skip
    if result.get("training"):
        lines += ["", "While training (each run's CSV log; means over a run's steps, then over the arm's runs, "
                  "their range in brackets):", "", *training_table(result["training"])]  # fmt: skip
    lines += rare_nll_lines(Path(settings.out_dir) / "rare_nll.json")
    return "\n".join(lines) + "\n"


def comparison_lines(result: dict[str, Any]) -> list[str]:
    """The paired comparisons' table (A - baseline per metric), with a blank line before and after."""
    lines = ["", "| comparison (A - B) | metric | n | mean [95 % t CI] | bootstrap CI | MDE | class |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, per in result["tests"].items():
        for m in result["metrics"]:
            p = per[m]
            boot = "-" if p["n"] < 2 else f"[{p['boot_low']:+.3f}, {p['boot_high']:+.3f}]"
            mde = "-" if p["n"] < 2 else f"{p['mde']:.3f}"
            lines.append(f"| {name} | {m} | {p['n']} | {_ci(p, signed=True)} | {boot} | {mde} | {p['class']} |")
    return [*lines, ""]


def load_settings(path: str) -> CompareSettings:
    """The settings of a compare YAML file (one line naming the file and key on a mistake)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of compare settings")
    try:
        return CompareSettings(**raw)
    except TypeError as err:
        raise ConfigError(f"{path}: {err}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``lit-fgrpo compare --config FILE [--report-only]``."""
    parser = argparse.ArgumentParser(prog="lit-fgrpo compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the compare settings (YAML)")
    parser.add_argument("--report-only", action="store_true", help="report the finished runs; start none")
    parser.add_argument("--runs", help="the runs' folder instead of the file's out_dir (e.g. a saved copy in docs/)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    settings = load_settings(args.config)
    if args.runs is not None:
        settings = replace(settings, out_dir=args.runs)
    if not args.report_only:
        run_all(settings)
    result = analyse(settings, collect(settings))
    curves, summaries = training_records(settings)
    result["training"] = summaries
    result["curves"] = {arm: [{str(k): v for k, v in c.items()} for c in per] for arm, per in curves.items()}
    result["preregistration"] = settings.preregistration
    result["base"] = base_values(settings)
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = render(result, settings)
    (out / "compare_report.md").write_text(text)
    (out / "compare_verdict.json").write_text(json.dumps(result, indent=2) + "\n")
    figure = None
    if any(curves.values()):
        start = result["base"].get("pass_at_1") if result.get("base") else None
        start = start if start is not None else result["before_rl"].get("pass_at_1", {}).get("mean")
        figure = curve_figure(curves, start)
        figure.savefig(out / "learning_curve.png")
        text += f"\nlearning curve: {out / 'learning_curve.png'}\n"
    if settings.mlflow is not None:
        text += f"logged to MLflow: {log_to_mlflow(settings, out, figure)}\n"
    print(text)
    return 0


def base_values(settings: CompareSettings) -> dict[str, float]:
    """The base model's held-out pass@k from ``base_results`` ({} when unset or not written yet)."""
    path = Path(settings.out_dir) / (settings.base_results or "")
    if settings.base_results is None or not path.is_file():
        return {}
    before = json.loads(path.read_text()).get("before", {})
    return {k: float(v) for k, v in before.items() if k.startswith("pass_at_")}


def training_records(
    settings: CompareSettings,
) -> tuple[dict[str, list[dict[int, float]]], dict[str, list[dict[str, float]]]]:
    """Arm -> each finished run's held-out curve, and arm -> each run's training statistics (from the CSV logs)."""
    curves: dict[str, list[dict[int, float]]] = {arm: [] for arm in settings.arms}
    summaries: dict[str, list[dict[str, float]]] = {arm: [] for arm in settings.arms}
    for arm in settings.arms:
        for seed in settings.seeds:
            folder = run_dir(settings, seed, arm)
            loaded = load_run(folder) if (folder / RESULTS).is_file() else None
            if loaded is not None:
                curves[arm].append(loaded[0])
                summaries[arm].append(loaded[1])
    return curves, summaries


def log_to_mlflow(settings: CompareSettings, out: Path, figure: Any) -> str:
    """Log the report, the verdict and the figure as one MLflow run; returns ``runs:/<id>``."""
    import mlflow  # lazy: an optional heavy import, only for a compare file that names a store

    client = mlflow.MlflowClient(tracking_uri=settings.mlflow)
    experiment = client.get_experiment_by_name("lit-fgrpo compare")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("lit-fgrpo compare")
    run = client.create_run(experiment_id, run_name=Path(settings.out_dir).name)
    run_id = run.info.run_id
    for name in ("compare_report.md", "compare_verdict.json"):
        client.log_artifact(run_id, str(out / name))
    if figure is not None:
        client.log_figure(run_id, figure, "figures/learning_curve.png")
    client.set_terminated(run_id)
    return f"runs:/{run_id}"


if __name__ == "__main__":
    raise SystemExit(main())
