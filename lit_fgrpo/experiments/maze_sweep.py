"""The paper's §6 maze sweep: per seed one warm start, then GRPO / F-GRPO arms over (N, gamma), resumable.

Every arm of a seed starts from that seed's warm-started weights and trains with the real Lightning ``Trainer`` +
:class:`~lit_fgrpo.training.module.FGRPOModule` + :class:`~lit_fgrpo.callbacks.RolloutCallback` (HF engine) on the same
prompt stream and sampling seeds. After each milestone (``milestones`` and ``rl_steps``) it reports held-out test
pass@k and ΔNLL_rare on one pool of base-policy correct trajectories (App. M.2).

Output directory, kept between runs (rerun the same command to continue; finished arms are skipped, an
interrupted arm resumes from its ``last.ckpt``)::

    out_dir/sweep_config.json             settings that must not change between runs (checked)
    out_dir/sweep_status.json             invocations so far, complete or not, pending (seed, arm, step) units
    out_dir/seed{s}/warm_start/           warm-start weights; base.json: warm-start test pass@k
    out_dir/seed{s}/N{N}_g{gamma}[_method]/  the arm's last.ckpt
    out_dir/seed{s}/maze_sweep.csv        one row per finished (arm, milestone) of seed s
    out_dir/maze_sweep.csv, .png          all seeds merged; -log pass@k against N

    lit-fgrpo maze-sweep --config configs/experiments/maze_evidence_cpu.yaml
    lit-fgrpo maze-sweep --seeds [0,1] --arms '["8:0", "8:0.5"]' --rl_steps 100 --out_dir outputs/maze_sweep
    lit-fgrpo maze-sweep --config configs/experiments/maze_methods_cpu.yaml    # GRPO, F-GRPO, MaxRL, band, dynamic

Exit status 0 when every unit is done, 75 when a step or time budget stopped it (rerun to continue), 2 on bad input.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch

from lit_fgrpo.commands.cli_errors import precheck_config_files, subcommand_error
from lit_fgrpo.data.data_settings import LoaderSettings, SplitSettings
from lit_fgrpo.experiments.arms_words import check_config_arms, quote_arms
from lit_fgrpo.experiments.rare_pool import build_rare_pool
from lit_fgrpo.experiments.sweep_arm import Arm, checkpoint_step, train_arm
from lit_fgrpo.experiments.sweep_checks import check_sweep_settings
from lit_fgrpo.experiments.sweep_report import (
    combine,
    log_arm,
    make_mlflow_logger,
    plot_neg_log_pass,
    read_csv,
    write_csv,
)
from lit_fgrpo.experiments.sweep_state import (
    Budget,
    add_seconds,
    check_or_write_config,
    pending_units,
    read_json,
    write_json,
)
from lit_fgrpo.experiments.warm_start import evaluate_pass_at_k, warm_start
from lit_fgrpo.reporting.progress import progress
from lit_fgrpo.tasks import MazeConfig, make_maze_splits
from lit_fgrpo.tasks.maze import maze_prompt_tokens
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import BatchingSettings, ObjectiveSettings, OptimizerSettings, PolicySettings

log = logging.getLogger(__name__)

EXIT_INCOMPLETE = 75
"""Exit status of a run stopped by its budget (EX_TEMPFAIL): rerun the same command to continue."""

DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 160,
    "tie_word_embeddings": True,
}
"""The 0.8M-parameter policy of configs/maze_cpu.yaml (measured in shared/docs/maze.md)."""


def run_maze_sweep(
    seeds: Sequence[int] = (0,),
    group_sizes: Sequence[int] = (4, 8, 16, 32),
    gammas: Sequence[float] = (0.0, 0.5, 1.0),
    arms: Sequence[str] | None = None,
    rl_steps: int = 100,
    milestones: Sequence[int] = (),
    prompts_per_step: int = 16,
    warm_start_steps: int = 450,
    eval_samples: int = 256,
    ks: Sequence[int] = (1, 8, 64, 256),
    out_dir: str = "outputs/maze_sweep",
    maze_rows: int = 4,
    maze_cols: int = 4,
    maze_seed: int | None = None,
    num_threads: int = 1,
    num_train: int = 20000,
    num_val: int = 64,
    num_test: int = 64,
    warm_start_batch: int = 64,
    warm_start_lr: float = 1e-3,
    warm_start_schedule: Literal["constant", "cosine"] = "constant",
    rl_lr: float = 1e-4,
    micro_batch_rows: int = 128,
    val_samples: int = 16,
    dnll_prompts: int = 128,
    dnll_samples: int = 64,
    dnll_top_fraction: float = 0.01,
    model_config: dict[str, Any] | None = None,
    tracking_uri: str | None = "sqlite:///mlflow.db",
    experiment: str = "maze_sweep",
    eval_chunk: int = 512,
    init_from: str | None = None,
    ckpt_every: int = 20,
    step_budget: int | None = None,
    time_budget_s: float | None = None,
    accelerator: str = "cpu",
    token_budget: int | None = None,
) -> list[dict[str, Any]]:
    """Warm-start each seed once, train every arm to each milestone, evaluate; resume whatever is unfinished.

    Args:
        seeds: Seeds; seed s sets model init, warm start, training mazes and prompt order, and sampling.
        group_sizes: Group sizes N of the (N x gamma) grid (ignored when ``arms`` is set).
        gammas: Focal exponents of the grid (0 = GRPO).
        arms: Explicit arms as ``"N:gamma"`` or ``"N:gamma:method"`` strings, e.g. ``["8:0", "8:0.5", "32:0"]``
            or ``["8:0:maxrl", "8:0:band", "8:0:dynamic", "8:0:gspo"]`` (the settings of ``configs/maze/``).
        rl_steps: RL steps (one optimizer step each) per arm; with ``token_budget``, the most an arm may take.
        milestones: Extra step counts below ``rl_steps`` at which each arm is also evaluated.
        prompts_per_step: Prompts per RL step.
        warm_start_steps: Supervised warm-start steps.
        eval_samples: Test samples per maze for pass@k (>= every k).
        ks: The k values of test pass@k.
        out_dir: Output folder, kept between runs.
        maze_rows: Maze cell rows.
        maze_cols: Maze cell columns.
        maze_seed: Seed of a test set shared by all seeds (None: each seed's own held-out test split).
        num_threads: ``torch.set_num_threads`` for the run (the caller's count is restored after).
        num_train: Training mazes.
        num_val: Validation mazes (pre-RL check that all arms of a seed start equal).
        num_test: Held-out test mazes.
        warm_start_batch: Warm-start batch size.
        warm_start_lr: Warm-start learning rate.
        warm_start_schedule: Warm-start learning-rate schedule (the paper's SFT uses cosine).
        rl_lr: RL learning rate.
        micro_batch_rows: Rollout rows per backward pass (memory only; the step is the same).
        val_samples: Samples per validation maze for the pre-RL check.
        dnll_prompts: Training mazes sampled for the ΔNLL_rare pool.
        dnll_samples: Base-policy samples per such maze.
        dnll_top_fraction: Fraction of the correct pool counted as rare (paper: 0.01).
        model_config: HF config dict of the policy (default: :data:`DEFAULT_MODEL_CONFIG`).
        tracking_uri: MLflow tracking URI (None or "none" = no MLflow).
        experiment: MLflow experiment name.
        eval_chunk: Rows per ``generate`` call in evaluation.
        init_from: A saved ``warm_start`` folder to load instead of warm-starting (only with a single seed).
        ckpt_every: Write an arm's ``last.ckpt`` every this many RL steps.
        step_budget: Stop after training this many RL steps in this run (None = no limit); rerun to continue.
        time_budget_s: Start no new work after this many seconds; training stops at the deadline (an evaluation
            already started still finishes). None = no limit.
        accelerator: ``cpu`` or ``gpu``.
        token_budget: Train each arm until it has generated this many completion tokens (discarded dynamic-sampling
            groups count), not a step count: methods that sample different amounts per step are compared at equal
            generation cost. The arm is then finished, whatever its step count (its row says ``trained_steps``).
            None = ``rl_steps`` steps.

    Returns:
        Every finished row in ``out_dir`` (this run's and earlier runs'), one per (seed, arm, milestone).
    """
    settings = dict(locals())
    arm_list = [Arm.parse(a) for a in arms] if arms else [Arm(n, float(g)) for n in group_sizes for g in gammas]
    steps = sorted({*milestones, rl_steps})
    check_sweep_settings(settings, arm_list, steps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_or_write_config(out, settings)
    status = read_json(out / "sweep_status.json")
    invocation = int(status.get("invocations", 0)) + 1
    write_json(out / "sweep_status.json", status | {"invocations": invocation})
    budget = Budget(step_budget, time_budget_s)
    uri = None if tracking_uri is None or tracking_uri.lower() == "none" else tracking_uri
    config = model_config or DEFAULT_MODEL_CONFIG
    maze_config = MazeConfig(maze_rows, maze_cols)
    device = torch.device("cuda" if accelerator in ("gpu", "cuda") else "cpu")
    left: list[str] = []

    def seed_rows(seed: int) -> list[dict[str, Any]]:
        path = out / f"seed{seed}" / "maze_sweep.csv"
        return read_csv(path) if path.exists() else []

    # One status line (or bar on a terminal) per finished seed: a sweep runs for hours.
    total_units = sum(len(pending_units(seed_rows(seed), arm_list, steps)) for seed in seeds)
    with progress("maze sweep", total=len(seeds), unit="seed") as bar:
        for seed in seeds:
            seed_dir = out / f"seed{seed}"
            rows = seed_rows(seed)
            todo = pending_units(rows, arm_list, steps)
            if todo and not budget.spent():
                threads = torch.get_num_threads()
                torch.set_num_threads(num_threads)  # for the run only: a caller in the same process keeps its own
                try:
                    rows = _run_seed(
                        seed, seed_dir, todo, rows, settings, config, maze_config, device, budget, uri, invocation
                    )
                finally:
                    torch.set_num_threads(threads)
            pending = pending_units(rows, arm_list, steps)
            left += [f"seed{seed}/{arm.name}@{m}" for arm, m in pending]
            bar.update(1, units_left=len(left), units_total=total_units)
    write_json(out / "sweep_status.json", {"invocations": invocation, "complete": not left, "pending": left,
                                            "steps_trained_last_run": budget.trained})  # fmt: skip
    # Every seed folder, also those of another process working on other seeds of this directory.
    all_rows = [row for path in sorted(out.glob("seed*/maze_sweep.csv")) for row in read_csv(path)]
    if all_rows:
        write_csv(all_rows, out / "maze_sweep.csv")
        final = [r for r in all_rows if int(r["rl_steps"]) == rl_steps]
        if final:
            plot_neg_log_pass(final, ks, out / "maze_sweep.png")
    log.info("%s: %d rows, %d units pending", out, len(all_rows), len(left))
    return all_rows


def _run_seed(
    seed: int,
    seed_dir: Path,
    todo: list[tuple[Arm, int]],
    rows: list[dict[str, Any]],
    s: dict[str, Any],
    config: dict[str, Any],
    maze_config: MazeConfig,
    device: torch.device,
    budget: Budget,
    uri: str | None,
    invocation: int,
) -> list[dict[str, Any]]:
    """Warm start (or reload) seed ``seed``, then train and evaluate its pending (arm, milestone) units in order."""
    val_ks = sorted({k for k in s["ks"] if k <= s["val_samples"]} | {1})
    data_args: dict[str, Any] = dict(
        source="maze", maze=MazeConfig(rows=s["maze_rows"], cols=s["maze_cols"]),
        splits=SplitSettings(num_train=s["num_train"], num_val=s["num_val"], num_test=s["num_test"],
                             val_size=s["num_val"]),
        loader=LoaderSettings(prompts_per_step=s["prompts_per_step"], val_batch_size=64),
        seed=seed, tokenizer_path="builtin:maze",
    )  # fmt: skip
    # Every group but the objective (temperature 1 and the arm's gamma and method: Arm.module).
    module_args: dict[str, Any] = dict(
        policy=PolicySettings(model_config=config, tokenizer="builtin:maze", seed=seed),
        optimizer=OptimizerSettings(lr=s["rl_lr"], max_grad_norm=1.0),
        batching=BatchingSettings(micro_batch_rows=s["micro_batch_rows"]), val_pass_at_k=val_ks,
    )  # fmt: skip
    L.seed_everything(seed, verbose=False)
    splits = make_maze_splits(maze_config, s["num_train"], s["num_val"], s["num_test"], seed)
    test = splits["test"]
    if s["maze_seed"] is not None:  # one test set for every seed; count any overlap with this seed's training pool
        test = make_maze_splits(maze_config, 0, 0, s["num_test"], s["maze_seed"])["test"]
    train_keys = {" ".join(maze_prompt_tokens(m)) for m in splits["train"]}
    overlap = sum(" ".join(maze_prompt_tokens(m)) in train_keys for m in test)
    base = FGRPOModule(objective=ObjectiveSettings(gamma=0.0), **module_args)
    policy: Any = base.policy.to(device)
    tokenizer = base.tokenizer
    base_info = _warm_start(seed, seed_dir, base, splits["train"], test, s)
    torch.manual_seed(seed + 2)
    pool = build_rare_pool(policy, tokenizer, splits["train"][: s["dnll_prompts"]], s["dnll_samples"], s["eval_chunk"])
    base_state = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
    shared = {
        "seed": seed, "prompts_per_step": s["prompts_per_step"], "lr": s["rl_lr"],
        "warm_start_steps": s["warm_start_steps"], "num_test": s["num_test"], "eval_samples": s["eval_samples"],
        "maze_rows": s["maze_rows"], "maze_cols": s["maze_cols"], "test_train_overlap": overlap,
        "dnll_pool_size": len(pool), "dnll_pool_sampled": pool.num_sampled, "dnll_top_fraction": s["dnll_top_fraction"],
    } | base_info  # fmt: skip
    max_tokens = s["maze_rows"] * s["maze_cols"] + 1
    for arm in dict.fromkeys(a for a, _ in todo):
        folder = seed_dir / arm.name
        logger = make_mlflow_logger(uri, s["experiment"], f"{arm.name}_s{seed}")
        for milestone in [m for a, m in todo if a == arm]:
            if budget.spent():
                return rows
            before = checkpoint_step(folder)
            if before > milestone:
                raise ValueError(f"{folder}/last.ckpt is at step {before}, past the unevaluated milestone {milestone}")
            left = budget.steps
            target = milestone if left is None else min(milestone, before + left)
            run = train_arm(
                folder, arm, base_state, module_args, data_args, target, s["val_samples"], seed, max_tokens,
                s["ckpt_every"], s["accelerator"], budget.seconds_left(), logger, s["token_budget"],
            )  # fmt: skip
            budget.trained += run.trained
            seconds = add_seconds(folder, run.seconds)
            if run.step < milestone and not run.budget_reached:
                return rows
            t0 = time.perf_counter()
            arm_policy: Any = run.policy.to(device)
            torch.manual_seed(seed + 1)  # every arm and the warm start sampled with the same stream
            row: dict[str, Any] = {"group_size": arm.group_size, "gamma": arm.gamma, "method": arm.method,
                                   "rl_steps": milestone, "trained_steps": run.step,
                                   "generated_tokens": run.generated_tokens}  # fmt: skip
            row |= {f"start_val_{k}": v for k, v in run.start_pass_at_k.items()}
            row |= evaluate_pass_at_k(arm_policy, tokenizer, test, s["eval_samples"], s["ks"], chunk=s["eval_chunk"])
            row["dnll_rare"], row["dnll_mean"] = pool.delta(arm_policy, s["dnll_top_fraction"])
            row |= {"rl_seconds": round(seconds, 1), "eval_seconds": round(time.perf_counter() - t0, 1)}
            row |= shared | {"invocation": invocation}
            if milestone == max(m for m in [*s["milestones"], s["rl_steps"]]):
                log_arm(logger, shared | {"group_size": arm.group_size, "gamma": arm.gamma, "method": arm.method},
                        row, milestone)  # fmt: skip
            rows.append(row)
            write_csv(rows, seed_dir / "maze_sweep.csv")
            log.info("seed %d arm %s step %d: %s", seed, arm.name, milestone, row)
    return rows


def _warm_start(
    seed: int, seed_dir: Path, base: FGRPOModule, train: Sequence[Any], test: Sequence[Any], s: dict[str, Any]
) -> dict[str, Any]:  # fmt: skip
    """Warm-start ``base`` (or reload it from ``seed_dir``) and return its test pass@k as ``base_*`` columns.

    The weights are saved before the evaluation, so a run stopped between the two only repeats the evaluation.
    """
    folder, info_path, seconds_path = seed_dir / "warm_start", seed_dir / "base.json", seed_dir / "warm_start.json"
    policy: Any = base.policy
    if s["init_from"] or folder.exists():
        source = Path(s["init_from"]) if s["init_from"] else folder
        missing, unexpected = policy.load_state_dict(_load_weights(source), strict=False)
        if unexpected or any(key != "lm_head.weight" for key in missing):  # lm_head is tied, not saved
            raise ValueError(f"{source} does not match the model: missing {missing}, unexpected {unexpected}")
    else:
        start = time.perf_counter()
        warm_start(policy, base.tokenizer, train, s["warm_start_steps"], s["warm_start_batch"],
                   s["warm_start_lr"], seed=seed, schedule=s["warm_start_schedule"])  # fmt: skip
        partial = seed_dir / "warm_start.partial"
        base.save_pretrained(partial)
        partial.rename(folder)  # atomic: a kill mid-save leaves no half-written warm_start/
        write_json(seconds_path, {"seconds": round(time.perf_counter() - start, 1)})
    if info_path.exists():
        return read_json(info_path)
    torch.manual_seed(seed + 1)
    metrics = evaluate_pass_at_k(policy, base.tokenizer, test, s["eval_samples"], s["ks"], chunk=s["eval_chunk"])
    seconds = float(read_json(seconds_path).get("seconds", float("nan")))
    info = {f"base_{k}": v for k, v in metrics.items()} | {"warm_start_seconds": seconds}
    write_json(info_path, info)
    log.info("seed %d warm start %.0f s, test %s", seed, seconds, metrics)
    return info


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of a policy saved with ``save_pretrained`` (safetensors)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state |= load_file(str(shard))
    if not state:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return state


def combine_sweeps(csvs: list[str], out_dir: str, ks: list[int] | None = None) -> int:
    """Merge sweep CSVs (e.g. from separate processes) into ``out_dir/maze_sweep.csv`` and redraw the figure.

    Args:
        csvs: The CSV files to merge.
        out_dir: Where the merged CSV and PNG go.
        ks: The k values to plot.
    """
    merged = combine(csvs, out_dir, ks or [1, 8, 64, 256])
    print(f"wrote {Path(out_dir) / 'maze_sweep.csv'} ({len(merged)} rows)")
    return 0


def build_parser() -> Any:
    """The ``lit-fgrpo maze-sweep`` parser: one flag per argument of :func:`run_maze_sweep`, plus ``--config``."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="lit-fgrpo maze-sweep", description=__doc__.split("\n\n")[0], exit_on_error=False)
    parser.add_argument("--config", action="config", help="a YAML file of these flags (configs/experiments/)")
    parser.add_function_arguments(run_maze_sweep)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``lit-fgrpo maze-sweep [--config FILE] [--flag value ...]`` or ``lit-fgrpo maze-sweep combine --csvs ...``."""
    words = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if words[:1] == ["combine"]:
        from jsonargparse import CLI

        return int(CLI(combine_sweeps, args=words[1:], as_positional=False, exit_on_error=False))
    precheck_config_files(words)
    check_config_arms(words)
    kwargs = build_parser().parse_args(quote_arms(words)).as_dict()  # bad flags raise: lit_fgrpo.cli prints one line
    kwargs.pop("config", None)
    try:
        rows = run_maze_sweep(**kwargs)
    except (ValueError, FileNotFoundError) as err:
        print(subcommand_error("maze-sweep", err), file=sys.stderr)
        return 2
    status = read_json(Path(kwargs["out_dir"]) / "sweep_status.json")
    print(f"{Path(kwargs['out_dir']) / 'maze_sweep.csv'}: {len(rows)} rows, {len(status.get('pending', []))} pending")
    if not status.get("complete", True):
        print("stopped by its budget: rerun the same command to continue")
        return EXIT_INCOMPLETE
    return 0


__all__ = ["DEFAULT_MODEL_CONFIG", "EXIT_INCOMPLETE", "build_parser", "combine_sweeps", "main", "run_maze_sweep"]


if __name__ == "__main__":
    from lit_fgrpo.commands.cli_errors import run_as_script

    raise SystemExit(run_as_script("maze-sweep", main))
