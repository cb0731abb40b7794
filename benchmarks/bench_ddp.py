"""Steps per second on the maze config: one process with 2 threads vs two DDP processes (gloo) with 1 thread each.

    python benchmarks/bench_ddp.py                 # 3 alternated repetitions of 30 RL steps each
    python benchmarks/bench_ddp.py --quick         # 1 repetition of 4 steps: checks that it runs

Both contenders train the same global batch (``data.loader.prompts_per_step`` of configs/maze_cpu.yaml, global) through
``lit-fgrpo fit``, each in its own fresh processes, in alternating order. Steps/s is timed between the starts of
training steps 2 and the last (the warm start, the model build and the DDP setup are not timed). Run it on an
otherwise idle machine with at least 2 free cores; figures under load are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import yaml

REPO = Path(__file__).resolve().parents[1]
CONTENDERS = {"1 process x 2 threads": (1, 2), "2 DDP processes x 1 thread": (2, 1)}


class StepClock(L.Callback):
    """Records the start time of every training step; rank 0 writes them to ``out``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.starts: list[float] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.starts.append(time.perf_counter())
        if trainer.is_global_zero:
            Path(self.out).write_text(json.dumps({"starts": self.starts, "world_size": trainer.world_size}))


def worker_config(out: Path, devices: int, steps: int, warm_steps: int) -> dict[str, Any]:
    settings = yaml.safe_load((REPO / "configs" / "maze_cpu.yaml").read_text())
    trainer = settings["trainer"]
    trainer |= {
        "devices": devices,
        "strategy": "ddp" if devices > 1 else "auto",
        "max_steps": steps,
        "limit_val_batches": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
    }
    callbacks = []
    for callback in trainer["callbacks"]:
        name = callback["class_path"].rsplit(".", 1)[-1]
        if name == "WarmStartCallback":
            callback["init_args"]["steps"] = warm_steps
        else:
            continue  # no checkpoints
        callbacks.append(callback)
    callbacks.append({"class_path": "bench_ddp.StepClock", "init_args": {"out": str(out)}})
    trainer["callbacks"] = callbacks
    settings["rollout"] |= {"validate_at_start": False, "log_samples_every": 0}
    settings["rollout"]["sampling"]["temperature"] = settings["model"].get("temperature", 1.0)
    # skip_zero_advantage stays on (the default): the module pads ranks to equal numbers of backwards under DDP.
    settings["model"] |= {"save_pretrained_dir": None}
    return settings


def worker(args: argparse.Namespace) -> int:
    import torch

    from lit_fgrpo.cli import cli_main

    torch.set_num_threads(args.threads)
    settings = worker_config(args.out, args.devices, args.steps, args.warm_steps)
    config = args.out.with_name(f"{args.out.stem}.{os.getpid()}.json")
    config.write_text(json.dumps(settings))
    cli_main(["fit", "--config", str(config)])
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_contender(devices: int, threads: int, steps: int, warm_steps: int, tmp: Path, tag: str) -> float:
    out = tmp / f"{tag}.json"
    env = dict(os.environ) | {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks")]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "TOKENIZERS_PARALLELISM": "false",
    }
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
    argv += [
        "--devices",
        str(devices),
        "--threads",
        str(threads),
        "--steps",
        str(steps),
        "--warm-steps",
        str(warm_steps),
    ]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{tag} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    starts = json.loads(out.read_text())["starts"]
    timed = starts[1:]  # from the start of step 2 to the end of training
    return (len(timed) - 1) / (timed[-1] - timed[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warm-steps", type=int, default=450, help="warm start (not timed) so groups are mixed")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 4 steps, short warm start")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        args.out = args.worker
        return worker(args)
    if args.quick:
        args.steps, args.reps, args.warm_steps = 4, 1, 10
    if args.steps < 3:
        parser.error("--steps must be >= 3 (the first step is not timed)")
    results: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="bench_ddp_") as tmp:
        for rep in range(args.reps):
            order = list(CONTENDERS) if rep % 2 == 0 else list(reversed(CONTENDERS))
            for name in order:
                devices, threads = CONTENDERS[name]
                tag = f"rep{rep}_{devices}x{threads}"
                rate = run_contender(devices, threads, args.steps, args.warm_steps, Path(tmp), tag)
                results[name].append(rate)
                print(f"rep {rep}: {name:<28} {rate:.3f} steps/s", flush=True)
    base = statistics.median(results["1 process x 2 threads"])
    print(f"\nmaze_cpu, global batch from the config, {args.steps} steps, {args.reps} repetition(s); median steps/s:")
    for name, rates in results.items():
        median = statistics.median(rates)
        print(f"  {name:<28} {median:.3f}   x{median / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
