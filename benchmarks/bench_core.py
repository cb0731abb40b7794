"""Core benchmark: PassAtK over 100,000 problems x n = 1024 and group_advantages over 65,536 groups of 8.

Prints each fast function beside its dumb reference (a Python loop with math.comb / per-group stats) measured
on a subset in the same run, and the ratio. Target from issue #2: pass@k at full size under 0.5 s.

    python benchmarks/bench_core.py
"""

from __future__ import annotations

import math
import sys
import time

import torch

from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.objectives import group_advantages


def best_of(fn, repeats: int = 3) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def loop_pass_at_k(correct: torch.Tensor, ks: list[int]) -> list[float]:
    n = correct.shape[1]
    totals = [0.0] * len(ks)
    for c in correct.sum(1).tolist():
        for i, k in enumerate(ks):
            totals[i] += 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)
    return [t / correct.shape[0] for t in totals]


def loop_advantages(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for p in range(rewards.shape[0]):
        r = rewards[p]
        if r.max() == r.min():
            continue
        out[p] = (1 - (r > 0).float().mean()) ** gamma * (r - r.mean()) / (r.std() + 1e-6)
    return out


def main() -> None:
    # One intra-op thread by default: on a shared 2-core machine two threads were up to 20x slower
    # (barrier waits under contention). Pass a number to compare: python benchmarks/bench_core.py 2
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(threads)
    print(f"torch threads: {threads}")
    torch.manual_seed(0)
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    problems, n = 100_000, 1024
    correct = torch.rand(problems, n) < torch.rand(problems, 1) * 0.3  # (P, n)

    def fast() -> None:
        metric = PassAtK(ks)
        metric.update(correct)
        metric.compute()

    t_fast = best_of(fast)
    sub = 2_000
    t_loop = best_of(lambda: loop_pass_at_k(correct[:sub], ks), repeats=1) * problems / sub
    print(f"PassAtK update+compute, {problems:,} x n={n}, {len(ks)} values of k: {t_fast:.3f} s  (target < 0.5 s)")
    print(f"  math.comb loop (timed on {sub:,}, scaled): {t_loop:.1f} s  -> speed-up x{t_loop / t_fast:.0f}")

    groups, size = 65_536, 8
    rewards = (torch.rand(groups, size) < torch.rand(groups, 1)).float()  # (P, G)
    t_adv = best_of(lambda: group_advantages(rewards, gamma=0.5))
    sub = 2_000
    t_adv_loop = best_of(lambda: loop_advantages(rewards[:sub], 0.5), repeats=1) * groups / sub
    print(f"group_advantages, {groups:,} groups x {size}: {t_adv * 1e3:.1f} ms")
    print(f"  per-group loop (timed on {sub:,}, scaled): {t_adv_loop:.2f} s  -> speed-up x{t_adv_loop / t_adv:.0f}")


if __name__ == "__main__":
    main()
