"""Seconds and peak memory of one forward + backward of the prompt-shared pass: weight gradients per call or deferred.

    python benchmarks/bench_deferred_grads.py               # 5 alternated repetitions, medians
    python benchmarks/bench_deferred_grads.py --reps 1      # a quick look

Each contender runs :func:`lit_fgrpo.models.logprobs.completion_logprobs` and the backward of a weighted sum of its
log-probs on SmolLM2-135M-Instruct, in a fresh process of its own, 1 torch thread, on the shape of
``benchmarks/bench_step.py``'s real-model step (4 plain-text arithmetic questions x 4 replies of at most 16 tokens, 10.5 on
average): full fine-tuning (every weight trainable) and LoRA r 16 on the 7 projections. The
contenders differ only in ``defer_weight_grads`` (:mod:`lit_fgrpo.models.deferred_grads`); their gradients are the
same sum in another order (tests/models/test_deferred_grads.py). ``--baseline-tree DIR`` adds a third contender, the
same pass on another checkout of the library (e.g. ``git worktree add /tmp/before HEAD~1``: the code before a
change, one embedding lookup per decoder call there). Reported per process: the median of 5 passes after
one warm-up pass, and the peak resident memory the passes added over the loaded model. Run it on an otherwise idle
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct"
CONTENDERS: dict[str, bool | None] = {"per call": False, "deferred": True, "baseline tree": None}
"""Contender name -> ``defer_weight_grads`` (None: not passed, the baseline checkout's own pass)."""
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
P, G, T = 4, 4, 16


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(case: str, defer: bool | None, passes: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_fgrpo.models.logprobs import completion_logprobs

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).train()
    if case == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
    gen = torch.Generator().manual_seed(0)
    prompts = [
        f"What is {a} + {b}? Reply with just the number." for a, b in torch.randint(1, 21, (P, 2), generator=gen)
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    prompt_ids = enc.input_ids.repeat_interleave(G, 0)  # (B, Tp)
    prompt_mask = enc.attention_mask.repeat_interleave(G, 0)  # (B, Tp)
    B = P * G
    lengths = torch.randint(5, T + 1, (B,), generator=gen)  # (B,) 10.5 tokens on average
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    completion = torch.randint(0, len(tokenizer), (B, T), generator=gen) * completion_mask  # (B, T)
    ids = torch.cat([prompt_ids, completion], dim=1)  # (B, Tp + T)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (B, Tp + T)
    weights = torch.randn(B, T, generator=gen) * completion_mask  # (B, T)
    kwargs = {} if defer is None else {"defer_weight_grads": defer}
    before = peak_mib()
    seconds = []
    for _ in range(passes + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logp = completion_logprobs(model, ids, mask, T, **kwargs).logp  # (B, T)
        (logp * weights).sum().backward()
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds[1:]), "added_peak_mib": peak_mib() - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="another checkout to time as a third contender"
    )
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        case, name = args.worker
        print(json.dumps(worker(case, CONTENDERS[name], args.passes)))
        return
    names = [name for name, defer in CONTENDERS.items() if defer is not None or args.baseline_tree]
    for case in args.cases:
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names if rep % 2 == 0 else names[::-1]:  # alternated order
                cmd = [sys.executable, __file__, "--worker", case, name, "--passes", str(args.passes)]
                tree = args.baseline_tree if CONTENDERS[name] is None else REPO
                env = os.environ | {"PYTHONPATH": str(Path(tree).resolve())}  # the library imported from there
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
                if proc.returncode != 0:
                    sys.exit(f"{case} {name}: the worker failed:\n{proc.stderr[-3000:]}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                results[name].append(r)
                print(
                    f"  {case} rep {rep + 1} {name}: {r['seconds']:.3f} s, +{r['added_peak_mib']:.0f} MiB", flush=True
                )
        sec = {name: statistics.median(r["seconds"] for r in runs) for name, runs in results.items()}
        mib = {name: statistics.median(r["added_peak_mib"] for r in runs) for name, runs in results.items()}
        print(f"{case}: " + ", ".join(f"{n} {sec[n]:.3f} s (+{mib[n]:.0f} MiB)" for n in names)
              + "; / per call: " + ", ".join(f"{n} {sec[n] / sec['per call']:.3f}" for n in names))  # fmt: skip


if __name__ == "__main__":
    main()
