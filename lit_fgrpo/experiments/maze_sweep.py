"""The paper's §6 maze sweep on a CPU scale: one shared warm start, then GRPO / F-GRPO arms over (N, gamma).

Every arm starts from the same warm-started weights and trains with the real Lightning ``Trainer`` +
:class:`~lit_fgrpo.module.FGRPOModule` + :class:`~lit_fgrpo.callbacks.RolloutCallback` (HF engine) for the same
number of RL steps on the same prompt stream. Each arm reports held-out test pass@k and ΔNLL_rare on one shared
pool of base-policy correct trajectories (App. M.2). Results go to ``out_dir/maze_sweep.csv`` (rewritten after
every arm), ``out_dir/maze_sweep.png`` and MLflow (one run per arm).

    lit-fgrpo maze-sweep --group-sizes 4 8 16 32 --gammas 0 0.5 1 --rl-steps 100 --out-dir outputs/maze_sweep
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch

from lit_fgrpo.callbacks import RolloutCallback, WarmStartCallback
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.experiments.rare_pool import RarePool, build_rare_pool
from lit_fgrpo.experiments.sweep_report import combine, log_arm, make_mlflow_logger, plot_neg_log_pass, write_csv
from lit_fgrpo.module import FGRPOModule
from lit_fgrpo.rollout.base import SamplingConfig
from lit_fgrpo.tasks import MazeConfig, evaluate_pass_at_k, make_maze_splits

log = logging.getLogger(__name__)

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
    group_sizes: Sequence[int] = (4, 8, 16, 32),
    gammas: Sequence[float] = (0.0, 0.5, 1.0),
    rl_steps: int = 100,
    prompts_per_step: int = 16,
    warm_start_steps: int = 450,
    eval_samples: int = 256,
    ks: Sequence[int] = (1, 8, 64, 256),
    seed: int = 0,
    out_dir: str | Path = "outputs/maze_sweep",
    maze_rows: int = 4,
    maze_cols: int = 4,
    num_threads: int = 1,
    num_train: int = 20000,
    num_val: int = 64,
    num_test: int = 64,
    warm_start_batch: int = 64,
    warm_start_lr: float = 1e-3,
    rl_lr: float = 1e-4,
    val_samples: int = 16,
    dnll_prompts: int = 128,
    dnll_samples: int = 64,
    dnll_top_fraction: float = 0.01,
    model_config: dict[str, Any] | None = None,
    tracking_uri: str | None = "sqlite:///mlflow.db",
    experiment: str = "maze_sweep",
    eval_chunk: int = 512,
    init_from: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Warm-start once, train every (N, gamma) arm for ``rl_steps`` and evaluate it.

    Args:
        group_sizes: Group sizes N (completions per prompt).
        gammas: Focal exponents (0 = GRPO).
        rl_steps: RL steps (one optimizer step each) per arm.
        prompts_per_step: Prompts per RL step (the same stream for every arm).
        warm_start_steps: Supervised warm-start steps (shared by all arms).
        eval_samples: Test samples per maze for pass@k (>= every k).
        ks: The k values of test pass@k.
        seed: Seed of mazes, model init, warm start, prompt order and sampling.
        out_dir: Output folder (CSV, PNG, warm-start weights).
        maze_rows: Maze cell rows.
        maze_cols: Maze cell columns.
        num_threads: ``torch.set_num_threads`` for the run.
        num_train: Training mazes.
        num_val: Validation mazes (pre-RL check that all arms start equal).
        num_test: Held-out test mazes.
        warm_start_batch: Warm-start batch size.
        warm_start_lr: Warm-start learning rate.
        rl_lr: RL learning rate.
        val_samples: Samples per validation maze for the pre-RL check.
        dnll_prompts: Training mazes sampled for the ΔNLL_rare pool.
        dnll_samples: Base-policy samples per such maze.
        dnll_top_fraction: Fraction of the correct pool counted as rare (paper: 0.01).
        model_config: HF config dict of the policy (default: :data:`DEFAULT_MODEL_CONFIG`).
        tracking_uri: MLflow tracking URI (None = no MLflow).
        experiment: MLflow experiment name.
        eval_chunk: Rows per ``generate`` call in evaluation.
        init_from: A ``warm_start`` folder saved by an earlier sweep with the same seed and model: load it instead
            of warm-starting again (so arms split across processes still share one warm start).

    Returns:
        One dict per arm (also written to ``out_dir/maze_sweep.csv``).
    """
    if any(k > eval_samples for k in ks):
        raise ValueError(f"every k in {list(ks)} must be <= eval_samples={eval_samples}")
    torch.set_num_threads(num_threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config or DEFAULT_MODEL_CONFIG
    val_ks = sorted({k for k in ks if k <= val_samples} | {1})
    data_args: dict[str, Any] = dict(
        source="maze", maze_rows=maze_rows, maze_cols=maze_cols, num_train=num_train, num_val=num_val,
        num_test=num_test, prompts_per_step=prompts_per_step, val_batch_size=64, seed=seed, val_size=num_val,
        tokenizer_path="builtin:maze",
    )  # fmt: skip
    module_args: dict[str, Any] = dict(
        model_config=config, tokenizer="builtin:maze", lr=rl_lr, max_grad_norm=1.0, temperature=1.0,
        micro_batch_rows=128, val_pass_at_k=val_ks, seed=seed,
    )  # fmt: skip
    L.seed_everything(seed, verbose=False)
    datamodule = PromptDataModule(**data_args)
    datamodule.setup("fit")
    mazes = make_maze_splits(MazeConfig(maze_rows, maze_cols), num_train, num_val, num_test, seed)

    start = time.perf_counter()
    base = FGRPOModule(gamma=0.0, **module_args)
    trainer_stub = SimpleNamespace(ckpt_path=None, datamodule=datamodule, logger=None)
    if init_from is None:
        WarmStartCallback(warm_start_steps, warm_start_batch, warm_start_lr).on_fit_start(trainer_stub, base)  # type: ignore[arg-type]
        base.save_pretrained(out / "warm_start")
    else:
        missing, unexpected = base.policy.load_state_dict(_load_weights(Path(init_from)), strict=False)
        if unexpected or any(key != "lm_head.weight" for key in missing):  # lm_head is tied, not saved
            raise ValueError(f"{init_from} does not match the model: missing {missing}, unexpected {unexpected}")
    base_state = copy.deepcopy(base.policy.state_dict())
    warm_seconds = time.perf_counter() - start
    tokenizer = base.tokenizer
    policy: Any = base.policy
    torch.manual_seed(seed + 1)
    base_eval = evaluate_pass_at_k(policy, tokenizer, mazes["test"], eval_samples, ks, chunk=eval_chunk)
    torch.manual_seed(seed + 2)
    pool = build_rare_pool(base.policy, tokenizer, mazes["train"][:dnll_prompts], dnll_samples, eval_chunk)
    log.info("warm start %.0fs, test %s, rare pool %d of %d", warm_seconds, base_eval, len(pool), pool.num_sampled)

    shared = {
        "seed": seed, "rl_steps": rl_steps, "prompts_per_step": prompts_per_step, "lr": rl_lr,
        "warm_start_steps": warm_start_steps, "num_test": num_test, "eval_samples": eval_samples,
        "warm_start_seconds": round(warm_seconds, 1), "dnll_pool_size": len(pool),
        "dnll_pool_sampled": pool.num_sampled, "dnll_top_fraction": dnll_top_fraction,
    } | {f"base_{k}": v for k, v in base_eval.items()}  # fmt: skip
    rows: list[dict[str, Any]] = []
    for group_size in group_sizes:
        for gamma in gammas:
            arm = _run_arm(
                group_size, float(gamma), base_state, module_args, data_args, datamodule, rl_steps, val_samples,
                seed, maze_rows * maze_cols + 1, make_mlflow_logger(tracking_uri, experiment, f"N{group_size}_g{gamma:g}_s{seed}"),
            )  # fmt: skip
            row = {"group_size": group_size, "gamma": float(gamma)} | arm.pop("start")
            t0 = time.perf_counter()
            torch.manual_seed(seed + 1)
            row |= evaluate_pass_at_k(arm["policy"], tokenizer, mazes["test"], eval_samples, ks, chunk=eval_chunk)
            row["dnll_rare"], row["dnll_mean"] = pool.delta(arm["policy"], dnll_top_fraction)
            row |= {"rl_seconds": arm["rl_seconds"], "eval_seconds": round(time.perf_counter() - t0, 1)} | shared
            log_arm(arm["logger"], shared | {"group_size": group_size, "gamma": gamma}, row, rl_steps)
            rows.append(row)
            write_csv(rows, out / "maze_sweep.csv")
            log.info("arm N=%d gamma=%g: %s", group_size, gamma, row)
    plot_neg_log_pass(rows, ks, out / "maze_sweep.png")
    return rows


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of a policy saved with ``save_pretrained`` (safetensors)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state |= load_file(str(shard))
    if not state:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return state


def _run_arm(
    group_size: int,
    gamma: float,
    base_state: dict[str, torch.Tensor],
    module_args: dict[str, Any],
    data_args: dict[str, Any],
    shared_data: PromptDataModule,
    rl_steps: int,
    val_samples: int,
    seed: int,
    max_tokens: int,
    logger: Any,
) -> dict[str, Any]:
    """Train one arm from the warm-start weights with the Lightning Trainer; returns its policy and timings."""
    module = FGRPOModule(gamma=gamma, **module_args)
    module.policy.load_state_dict(base_state)
    datamodule = PromptDataModule(**data_args)
    datamodule.splits = shared_data.splits  # same rendered records; setup() keeps them
    done_id = int(module.tokenizer.convert_tokens_to_ids("DONE"))
    sampling = SamplingConfig(n=group_size, temperature=1.0, max_tokens=max_tokens, stop_token_ids=[done_id])
    rollout = RolloutCallback(
        engine="hf", sampling=sampling, val_samples=val_samples, reward_funcs=["maze"], log_samples_every=0, seed=seed
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=rl_steps, limit_val_batches=0, num_sanity_val_steps=0,
        logger=logger if logger is not None else False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, log_every_n_steps=10, callbacks=[rollout],
    )  # fmt: skip
    L.seed_everything(seed, verbose=False)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    start_metrics = {f"start_val_{k}": v for k, v in rollout.start_pass_at_k.items()}
    return {
        "policy": module.policy,
        "start": start_metrics,
        "rl_seconds": round(time.perf_counter() - start, 1),
        "logger": logger,
    }


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``lit-fgrpo maze-sweep`` (one per argument of :func:`run_maze_sweep`, plus ``--seeds``)."""
    p = argparse.ArgumentParser(prog="lit-fgrpo maze-sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    p.add_argument("--rl-steps", type=int, default=100)
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--warm-start-steps", type=int, default=450)
    p.add_argument("--warm-start-batch", type=int, default=64)
    p.add_argument("--warm-start-lr", type=float, default=1e-3)
    p.add_argument("--rl-lr", type=float, default=1e-4)
    p.add_argument("--eval-samples", type=int, default=256)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="one sweep (own warm start) per seed")
    p.add_argument("--out-dir", default="outputs/maze_sweep")
    p.add_argument("--maze-rows", type=int, default=4)
    p.add_argument("--maze-cols", type=int, default=4)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--num-train", type=int, default=20000)
    p.add_argument("--num-val", type=int, default=64)
    p.add_argument("--num-test", type=int, default=64)
    p.add_argument("--val-samples", type=int, default=16)
    p.add_argument("--dnll-prompts", type=int, default=128)
    p.add_argument("--dnll-samples", type=int, default=64)
    p.add_argument("--dnll-top-fraction", type=float, default=0.01)
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow URI; 'none' disables MLflow")
    p.add_argument("--experiment", default="maze_sweep")
    p.add_argument("--init-from", default=None, help="load this saved warm_start folder instead of warm-starting")
    p.add_argument("--combine", nargs="+", default=None, help="only merge these sweep CSVs into --out-dir")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lit-fgrpo maze-sweep``: run the sweep for each seed and write the combined CSV/PNG."""
    args = vars(build_parser().parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    seeds = args.pop("seeds")
    out = Path(args.pop("out_dir"))
    if args["combine"]:
        merged = combine(args["combine"], out, args["ks"])
        print(f"wrote {out / 'maze_sweep.csv'} ({len(merged)} arms)")
        return 0
    del args["combine"]
    if args["tracking_uri"].lower() == "none":
        args["tracking_uri"] = None
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        rows += run_maze_sweep(seed=seed, out_dir=out / f"seed{seed}" if len(seeds) > 1 else out, **args)
    if len(seeds) > 1:
        write_csv(rows, out / "maze_sweep.csv")
        plot_neg_log_pass(rows, args["ks"], out / "maze_sweep.png")
    print(f"wrote {out / 'maze_sweep.csv'} ({len(rows)} arms)")
    return 0


__all__ = ["DEFAULT_MODEL_CONFIG", "RarePool", "build_parser", "main", "run_maze_sweep"]


if __name__ == "__main__":
    raise SystemExit(main())
