"""Generation overhead on the real model: vLLM's own ``LLM.generate`` against our engine and our collector.

Contenders, each a fresh process per repetition (order alternating), on SmolLM2-135M-Instruct (imported by
``scripts/setup.sh`` into ``models/``), the same chat-templated arithmetic prompts, per-prompt seeds and lengths:

  vllm       ``vllm.LLM.generate`` with the engine options our CPU engine uses (float32, eager, whole prefills,
             the same KV cache), token ids in, no detokenizing: vLLM itself.
  engine     :class:`lit_fgrpo.engines.vllm_engine.VLLMEngine.generate`: our request path (one request per prompt with
             its own seed, the sampled tokens' log-probs, rows prompt-major).
  collector  :class:`lit_fgrpo.rollout.RolloutCollector.collect`: the engine plus decoding, the ``last_number`` reward
             and packing into the padded training tensors: what a training step waits for.
  http       one stock ``vllm serve`` launched on the model (our launcher's flags, vLLM's own process layout: API
             server, engine core and worker, the worker's threads on one core and one core reserved), and the same
             requests as the server engine's posted by a plain thread pool over ``httpx``: vLLM's server itself.
  server     :class:`lit_fgrpo.servers.engine.ServerEngine.generate` on such a server: our request path to it
             (request bodies, dispatch over the fleet with retries, parsing token ids and log-probs).

The first three share one process layout (in-process, ``--threads`` threads) and are compared with ``vllm``; the two
server contenders have another (the server's processes on 2 cores) and ``server`` is compared with ``http``.

Each worker starts its engine, runs one warm-up call, then times ``--calls`` calls; tokens/s = generated tokens /
wall time of a call (median over calls, then over repetitions). The same seeds give the same tokens in all three, so
the token counts must agree (checked).

    python benchmarks/bench_generation.py --quick            # smoke test, ~3 min
    python benchmarks/bench_generation.py --reps 3           # 16 prompts x 8 samples x 16 tokens, ~20 min idle
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
CONTENDERS = ("vllm", "engine", "collector", "http", "server")
BASELINE = {"vllm": "vllm", "engine": "vllm", "collector": "vllm", "http": "http", "server": "http"}
"""Each contender's reference: the in-process vLLM for the in-process ones, the bare HTTP client for the server."""
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
    engine = VLLMEngine(MODEL, eos_token_id=2, max_model_len=128, in_process=True)  # <|im_end|> is id 2
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

    elif who == "engine":

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 4 samples x 8 tokens, 1 repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per worker (after one warm-up call)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each worker")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.quick:
        a.reps, a.prompts, a.n, a.max_tokens, a.calls = 1, 4, 4, 8, 2
    if a.worker:
        result = worker(a.worker, a.prompts, a.n, a.max_tokens, a.calls, a.threads)
        Path(a.out).write_text(json.dumps(result))
        return
    if not (MODEL / "config.json").is_file():
        sys.exit(f"error: {MODEL} is not a model folder: run bash scripts/setup.sh (it imports SmolLM2)")
    print(f"P={a.prompts} n={a.n} max_tokens={a.max_tokens} calls={a.calls} reps={a.reps} threads={a.threads}; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {who: [] for who in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
            for who in order:
                out = Path(tmp) / f"{who}.json"
                cmd = [sys.executable, __file__, "--worker", who, "--out", str(out), "--prompts", str(a.prompts),
                       "--n", str(a.n), "--max-tokens", str(a.max_tokens), "--calls", str(a.calls),
                       "--threads", str(a.threads)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"the {who} worker failed:\n{proc.stderr[-3000:]}")
                r = json.loads(out.read_text())
                results[who].append(r)
                print(f"  rep {rep + 1} {who}: {r['tokens']} tokens in {r['seconds']:.2f} s "
                      f"({r['tokens'] / r['seconds']:.1f} tok/s)", flush=True)  # fmt: skip
    tokens = {who: {r["tokens"] for r in results[who]} for who in CONTENDERS}
    if len({t for ts in tokens.values() for t in ts}) != 1:
        print(f"WARNING: the contenders generated different token counts: {tokens}")
    rate = {who: statistics.median(r["tokens"] / r["seconds"] for r in results[who]) for who in CONTENDERS}
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    print(f"{'contender':<10} {'tok/s':>8} {'spread':>17} {'overhead':>9}  against")
    for who in CONTENDERS:
        rates = [r["tokens"] / r["seconds"] for r in results[who]]
        overhead = rate[BASELINE[who]] / rate[who] - 1
        print(f"{who:<10} {rate[who]:>8.1f} {min(rates):>8.1f}-{max(rates):<8.1f} {overhead:>+9.1%}  {BASELINE[who]}")
    print("goal (issue 34): engine and collector within 10% of vllm, server within 10% of http")


if __name__ == "__main__":
    main()
