"""Where one generation call's time goes, on each engine: the profile behind docs/generation-profile.md.

One worker process per engine (``hf``: the HF engine's own loop with the lean step; ``hf_forward``: the same loop
through the model's forward; ``engine``: the in-process vLLM engine with its CPU defaults), on SmolLM2-135M-Instruct
and ``benchmarks/bench_generation.py``'s batches. Each worker runs one warm-up call, then:

1. a timed call with the phases' own clocks: the functions each phase runs are wrapped, in this process only, by a
   timer (``perf_counter`` around the call, summed; nested phases are shown indented under their parent and are
   part of its time);
2. a call under ``torch.profiler``: the torch operators' own CPU time grouped into matmuls, attention, the sampler's
   work over the vocabulary, and the rest; wall time minus all operators' time is Python and bookkeeping.

Nothing here changes what the engines compute; the wrappers only add two clock reads per call (a few microseconds
a decoding step). Run it on an idle machine::

    python benchmarks/profile_generation.py                       # eval batch, every engine
    python benchmarks/profile_generation.py --batch rollout --engines hf
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import BATCHES, MODEL, SEED, STEP, STREAM, prompts  # noqa: E402

ENGINES = ("hf", "hf_forward", "engine")
CLOCKS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
STACK: list[str] = []

# phase name -> (module, attribute path) of the function it times; a phase listed under another runs inside it
HF_PHASES = {
    "prefill": ("lit_fgrpo.engines.decode", "prefill"),
    "decode step (lean)": ("lit_fgrpo.engines.decode", "_LeanRows.step"),
    "decode step (model forward)": ("lit_fgrpo.engines.decode", "_HFRows.step"),
    "sampler (draw + log-prob)": ("lit_fgrpo.engines.row_sampling", "RowSampler.draw"),
    "drop finished rows": ("lit_fgrpo.engines.decode", "_LeanRows.keep"),
}
VLLM_PHASES = {
    "scheduler.schedule": ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"),
    "runner._update_states": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states"),
    "runner._prepare_inputs": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs"),
    "runner._model_forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward"),
    "  attention": ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward"),
    "model.compute_logits": ("vllm.model_executor.models.llama", "LlamaForCausalLM.compute_logits"),
    "runner._sample": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    "  sampler.compute_logprobs": ("vllm.v1.sample.sampler", "Sampler.compute_logprobs"),
    "scheduler.update_from_output": ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    "output_processor.process_outputs": ("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs"),
}


def clock(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its time added to ``CLOCKS[phase]`` (a phase re-entered inside itself counts once)."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if phase in STACK:
            return fn(*args, **kwargs)
        STACK.append(phase)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCKS[phase] += time.perf_counter() - start
            CALLS[phase] += 1
            STACK.pop()

    return timed


def install(phases: dict[str, tuple[str, str]]) -> list[str]:
    """Wrap each phase's function; returns the phases whose function this version lacks (left out)."""
    import importlib
    import inspect

    missing = []
    for phase, (module_name, path) in phases.items():
        try:
            owner: Any = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            wrapped = clock(phase, getattr(owner, name))
            static = isinstance(inspect.getattr_static(owner, name), staticmethod)
            setattr(owner, name, staticmethod(wrapped) if static else wrapped)
        except (ImportError, AttributeError):
            missing.append(phase)
    return missing


def category(op: str) -> str:
    """A torch operator's group in the table."""
    name = op.lower()
    if any(k in name for k in ("attention", "attn", "paged", "sdpa", "bmm", "baddbmm")):
        return "attention"
    if any(k in name for k in ("mm", "linear", "matmul", "onednn", "gemm")):
        return "matmuls (projections, MLP, output layer)"
    sampler = ("sort", "cumsum", "exp", "softmax", "log_softmax", "logsumexp", "max", "searchsorted", "gather", "div")
    if any(k in name for k in sampler):
        return "vocabulary-wide (softmax, exp, sums, max, search)"
    return "other operators"


def worker(who: str, batch: str, threads: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lit_fgrpo.distributed import prompt_seed
    from lit_fgrpo.engines.base import SamplingConfig

    torch.set_num_threads(threads)
    count, n, max_tokens = BATCHES[batch]
    _, ids, _ = prompts(count)
    seeds = [prompt_seed(SEED, position, STEP, STREAM) for position in range(count)]
    sampling = SamplingConfig(n=n, temperature=1.0, max_tokens=max_tokens, seed=SEED)
    if who == "engine":
        from lit_fgrpo.engines.vllm_engine import VLLMEngine

        missing = install(VLLM_PHASES)
        engine: Any = VLLMEngine(MODEL, eos_token_id=2, max_model_len=128, in_process=True, threads=threads)
    else:
        from transformers import AutoModelForCausalLM

        from lit_fgrpo.engines.hf import HFEngine

        missing = install(HF_PHASES)
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        engine = HFEngine(model, pad_token_id=2, eos_token_id=2, lean=who == "hf", threads=threads)

    def run() -> int:
        return sum(len(c) for c in engine.generate(ids, sampling, seeds=seeds).completion_ids)

    run()
    CLOCKS.clear()
    CALLS.clear()
    start = time.perf_counter()
    tokens = run()
    wall = time.perf_counter() - start
    clocks, calls = dict(CLOCKS), dict(CALLS)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        profiled_wall = time.perf_counter() - start
    groups: dict[str, float] = defaultdict(float)
    top = []
    for event in prof.key_averages():
        self_s = event.self_cpu_time_total / 1e6
        groups[category(event.key)] += self_s
        top.append((self_s, event.key, event.count))
    top.sort(reverse=True)
    if who == "engine":
        engine.close()
    return {
        "who": who, "batch": batch, "threads": threads, "tokens": tokens, "wall": wall, "phases": clocks,
        "calls": calls, "missing": missing, "profiled_wall": profiled_wall, "groups": dict(groups),
        "top_ops": top[:12],
    }  # fmt: skip


def report(r: dict[str, Any]) -> None:
    print(f"\n## {r['who']}: {r['batch']} batch, {r['tokens']} tokens in {r['wall']:.2f} s "
          f"({r['tokens'] / r['wall']:.1f} tok/s, {r['threads']} threads)")  # fmt: skip
    print("phase | seconds | share of the call | calls")
    for phase, seconds in r["phases"].items():
        print(f"{phase} | {seconds:.2f} | {seconds / r['wall']:.1%} | {r['calls'][phase]}")
    top_level = sum(s for p, s in r["phases"].items() if not p.startswith(" "))
    print(f"(outside the phases above) | {r['wall'] - top_level:.2f} | {(r['wall'] - top_level) / r['wall']:.1%} |")
    if r["missing"]:
        print(f"(phases this version lacks: {', '.join(r['missing'])})")
    ops = sum(r["groups"].values())
    wall = r["profiled_wall"]
    print(f"\ntorch operators' own time under the profiler (call {wall:.2f} s with the profiler on):")
    print("group | seconds | share of the call")
    for group, seconds in sorted(r["groups"].items(), key=lambda kv: -kv[1]):
        print(f"{group} | {seconds:.2f} | {seconds / wall:.1%}")
    print(f"outside torch operators (Python, scheduling) | {wall - ops:.2f} | {(wall - ops) / wall:.1%}")
    print("top operators: " + "; ".join(f"{name} {s:.2f} s ({count})" for s, name, count in r["top_ops"][:8]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="eval", choices=sorted(BATCHES))
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {ENGINES}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.batch, args.threads)))
        return
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}")
    for who in args.engines.split(","):
        command = [sys.executable, __file__, "--worker", who, "--batch", args.batch, "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{who}: failed\n{done.stderr[-2000:]}")
            continue
        report(json.loads(lines[-1][len("RESULT ") :]))


if __name__ == "__main__":
    main()
