"""Peak memory and seconds of one training pass over multi-turn-shaped rows: micro-batches cut by rows or by tokens.

    python benchmarks/bench_micro_batches.py                 # 3 alternated repetitions, medians
    python benchmarks/bench_micro_batches.py --reps 1        # a quick look

Each contender runs :meth:`FGRPOModule.backward_on` (the forward/backward of the whole rollout, no optimizer step)
once, in a fresh process of its own, on the same synthetic rollout shaped like the retry demo's
(``configs/smollm2/retry.yaml``: SmolLM2-135M-Instruct with LoRA r 16 on every projection, 8 questions x 8 episodes,
a 45-token prompt of its own per row, so that no forward shares one; episodes of 8 to 120 tokens). Reported: the peak resident memory the pass added over the loaded
model (``ru_maxrss`` after minus before), its seconds, and the forwards it took. The gradient is the same for every
cut (``tests/training/test_micro_batch_trimming.py``). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct"
CONTENDERS: dict[str, dict[str, Any]] = {
    "rows 32": {"micro_batch_rows": 32},
    "rows 8": {"micro_batch_rows": 8},
    "tokens 1024": {"micro_batch_rows": 64, "micro_batch_tokens": 1024},
    "tokens 512": {"micro_batch_rows": 64, "micro_batch_tokens": 512},
}
"""The retry demo's setting until this benchmark, a row count that bounds memory by rows alone, and two token budgets
alone (64 rows at most: the whole rollout)."""
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(batching: dict[str, Any], threads: int) -> dict[str, Any]:
    import torch

    from lit_fgrpo.models.lora import LoraSettings
    from lit_fgrpo.rollout.batch import RolloutBatch
    from lit_fgrpo.training.module import FGRPOModule
    from lit_fgrpo.training.module_settings import BatchingSettings, OptimizerSettings, PolicySettings

    torch.set_num_threads(threads)
    module = FGRPOModule(
        policy=PolicySettings(model=str(MODEL), lora=LoraSettings(r=16, alpha=32, target_modules=LORA_TARGETS)),
        optimizer=OptimizerSettings(lr=1e-3),
        batching=BatchingSettings(**batching),
    )
    P, G, Tp, T = 8, 8, 45, 120
    B = P * G
    gen = torch.Generator().manual_seed(0)
    vocab = module.policy.get_input_embeddings().weight.shape[0]
    lengths = torch.randint(8, T + 1, (B,), generator=gen)  # (B,) episodes of 1 to 3 replies
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    correct = torch.rand(P, G, generator=gen) < 0.5  # (P, G)
    rollout = RolloutBatch(
        input_ids=torch.randint(0, vocab, (B, Tp + T), generator=gen),
        attention_mask=torch.cat([torch.ones(B, Tp, dtype=torch.long), completion_mask.long()], dim=1),
        completion_mask=completion_mask,
        rewards=correct.float(),
        correct=correct,
        max_completion_length=T,
    )
    forwards: list[int] = []
    hook = module.policy.get_input_embeddings().register_forward_hook(lambda m, i, o: forwards.append(i[0].numel()))
    before = peak_mib()
    start = time.perf_counter()
    module.backward_on(rollout)
    seconds = time.perf_counter() - start
    hook.remove()
    return {
        "added_peak_mib": peak_mib() - before,
        "seconds": seconds,
        "forwards": len(forwards),
        "largest_forward_tokens": max(forwards),
        "tokens": float(completion_mask.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(CONTENDERS[args.worker], args.threads)))
        return
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:  # alternated order
            cmd = [sys.executable, __file__, "--worker", name, "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if proc.returncode != 0:
                sys.exit(f"{name}: the worker failed:\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[name].append(r)
            print(f"  rep {rep + 1} {name}: +{r['added_peak_mib']:.0f} MiB, {r['seconds']:.2f} s", flush=True)
    print(f"\n{'contender':<22} {'added peak MiB':>15} {'seconds':>8} {'forwards':>9} {'largest forward':>16}")
    for name, runs in results.items():
        mib = statistics.median(r["added_peak_mib"] for r in runs)
        sec = statistics.median(r["seconds"] for r in runs)
        print(f"{name:<22} {mib:>15.0f} {sec:>8.2f} {runs[0]['forwards']:>9} {runs[0]['largest_forward_tokens']:>16}")


if __name__ == "__main__":
    main()
