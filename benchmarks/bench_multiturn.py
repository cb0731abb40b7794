"""Multi-turn overhead on the real model: the episode driver against vLLM's own generation of the same tokens, and one
training step of the ``retry`` environment against a single-turn step.

Contenders, each a fresh process per repetition (order alternating), on SmolLM2-135M-Instruct (imported by
``scripts/setup.sh`` into ``models/``), the chat-templated arithmetic questions of ``configs/smollm2/retry.yaml``:

  vllm       ``vllm.LLM.generate`` replaying the requests the driver makes (each turn's rows, their own seeds, the
             turn's ``max_tokens``), token ids in, no detokenizing: vLLM itself generating the same tokens. The
             requests are recorded in an untimed run of the driver first.
  driver     :meth:`lit_fgrpo.rollout.episodes.EpisodeRollouts.run`: the episodes of the same prompts and seeds,
             one :class:`~lit_fgrpo.engines.vllm_engine.VLLMEngine` call per turn plus the environment's replies in
             the chat template's markers (goal: at most 10 % over ``vllm``).
  retry      one training step of the ``retry`` environment: push the weights, collect the episodes (driver,
             rewards, packing), the update (LoRA r 16, one optimizer step).
  single     one single-turn training step (the same questions, ``last_number``), ``max_tokens`` chosen so that it
             samples about as many tokens as the episodes' model turns.

The step contenders are compared per sampled (model) token, since their token counts differ a little; ``driver`` must
sample exactly ``vllm``'s tokens (checked). Each worker runs one warm-up call, then ``--calls`` timed calls (median).

    python benchmarks/bench_multiturn.py --quick          # smoke test, a few minutes
    python benchmarks/bench_multiturn.py --reps 3         # 8 prompts x 8 episodes x 3 turns, ~20 min idle
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as configs/smollm2/retry.yaml runs it
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
CONTENDERS = ("vllm", "driver", "retry", "single")
BASELINE = {"vllm": "vllm", "driver": "vllm", "retry": "single", "single": "single"}
STEP, STREAM, SEED = 3, 0, 1234
MAX_MODEL_LEN = 256


def records(count: int) -> list[Any]:
    """``count`` arithmetic questions in SmolLM2's chat template (with their messages), as the data module renders."""
    import torch
    from transformers import AutoTokenizer

    from lit_fgrpo.data.records import SourceExample, render_records

    g = torch.Generator().manual_seed(0)
    pairs = torch.randint(1, 21, (count, 2), generator=g).tolist()
    examples = [
        SourceExample(f"What is {a} + {b}? Reply with just the number.", {"answer": str(a + b)}, index=i)
        for i, (a, b) in enumerate(pairs)
    ]
    rendered = render_records(examples, AutoTokenizer.from_pretrained(MODEL), max_prompt_length=128)
    for record in rendered:
        record.position = record.index
    return rendered


def settings(n: int, max_tokens: int, turns: int, environment: bool) -> Any:
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.rollout.rollout_settings import RolloutSettings

    sampling = SamplingConfig(n=n, temperature=1.0, max_tokens=max_tokens, seed=SEED)
    multi = {
        "environment": "retry",
        "environment_args": {"max_attempts": turns},
        "max_turns": turns,
        "max_episode_tokens": turns * (max_tokens + 16),  # room for every turn: the driver cuts no row short
    }
    return RolloutSettings(
        engine="vllm", sampling=sampling, reward_funcs=None if environment else ["last_number"],
        correct_threshold=0.2, engine_kwargs={"max_model_len": MAX_MODEL_LEN}, **(multi if environment else {}),
    )  # fmt: skip


def worker(who: str, count: int, n: int, max_tokens: int, turns: int, calls: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    if who in ("retry", "single"):
        return step_worker(who, count, n, max_tokens, turns, calls)
    from transformers import AutoTokenizer

    from lit_fgrpo.engines.vllm_engine import VLLMEngine
    from lit_fgrpo.rollout.episodes import EpisodeRollouts

    s = settings(n, max_tokens, turns, environment=True)
    # the context is the engine's max_model_len (SmolLM2's own, 8192, is longer)
    episodes = EpisodeRollouts.build(s, AutoTokenizer.from_pretrained(MODEL), policy=None)
    engine = VLLMEngine(MODEL, eos_token_id=2, max_model_len=MAX_MODEL_LEN, in_process=True)  # <|im_end|> is 2
    sampling = s.train_sampling()
    starts = episodes.starts(records(count), sampling, STEP, STREAM)
    calls_made: list[tuple[list[list[int]], list[int]]] = []
    generate = engine.generate

    def recording(prompts: list[list[int]], turn_sampling: Any, seeds: Any = None) -> Any:
        calls_made.append(([list(p) for p in prompts], list(seeds)))
        return generate(prompts, turn_sampling, seeds)

    engine.generate = recording  # type: ignore[method-assign]
    episodes.run(engine, starts, sampling)  # records the requests of every turn (untimed)
    engine.generate = generate  # type: ignore[method-assign]
    if who == "vllm":
        from vllm import SamplingParams

        llm, turn = engine.llm, episodes.turn_sampling(sampling)

        def run() -> int:
            tokens = 0
            for prompts, seeds in calls_made:
                params = [
                    SamplingParams(n=1, temperature=turn.temperature, top_p=turn.top_p, top_k=0,
                                   max_tokens=turn.max_tokens, stop_token_ids=[2, *turn.stop_token_ids], seed=seed,
                                   logprobs=0, detokenize=False)
                    for seed in seeds
                ]  # fmt: skip
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
                tokens += sum(len(c.token_ids) for o in outs for c in o.outputs)
            return tokens

    else:

        def run() -> int:
            done = episodes.run(engine, starts, sampling)
            return sum(len(seg.ids) for e in done for seg in e.segments if seg.trained)

    try:
        return timed(run, calls) | {"turn_calls": len(calls_made)}
    finally:
        engine.close()


def step_worker(who: str, count: int, n: int, max_tokens: int, turns: int, calls: int) -> dict[str, Any]:
    """One training step per call: push, collect, update (LoRA, one optimizer step)."""
    from lit_fgrpo.rollout.schedule import RolloutParts
    from lit_fgrpo.rollout.source import RolloutSource
    from lit_fgrpo.training.module import FGRPOModule
    from lit_fgrpo.training.module_settings import grouped_settings
    from lit_fgrpo.training.update_handles import TorchCollectives, TorchOptimizerStep

    lora = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    module = FGRPOModule(**grouped_settings({"model": str(MODEL), "lora": lora, "lr": 1e-3, "gamma": 0.5}))
    module.configure_model()
    # the single-turn step samples up to the episodes' model tokens in one reply (about as many tokens in all)
    s = settings(n, max_tokens if who == "retry" else max_tokens * turns, turns, environment=who == "retry")
    source = RolloutSource(s)
    source.bind(module)  # type: ignore[arg-type]  # FGRPOModule is a RolloutConsumer
    parts: RolloutParts = source.build()
    optimizer_config = module.configure_optimizers()
    optimizer = TorchOptimizerStep(optimizer_config["optimizer"], optimizer_config["lr_scheduler"]["scheduler"])
    prompts = records(count)
    update = module.policy_update()
    step = [STEP]

    def run() -> int:
        parts.engine_sync.push(step[0], parts.collector.last)
        rollout = parts.collector.collect(prompts, parts.train_sampling, step=step[0], stream=STREAM)
        update.step(rollout, optimizer, TorchCollectives())
        step[0] += 1
        return int(rollout.stats["generated_tokens"])

    try:
        return timed(run, calls)
    finally:
        source.close()


def timed(run: Callable[[], int], calls: int) -> dict[str, Any]:
    """One warm-up call (first-call allocations), then ``calls`` timed calls: median seconds, sampled tokens."""
    run()
    times, tokens = [], []
    for _ in range(calls):
        start = time.perf_counter()
        tokens.append(run())
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "tokens": statistics.median(tokens), "all_tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 prompts x 2 episodes x 8 tokens, 1 repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per model turn")
    parser.add_argument("--turns", type=int, default=3, help="max_turns and the retry environment's max_attempts")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per worker (after one warm-up call)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each worker")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.quick:
        a.reps, a.prompts, a.n, a.max_tokens, a.calls = 1, 2, 2, 8, 1
    if a.worker:
        result = worker(a.worker, a.prompts, a.n, a.max_tokens, a.turns, a.calls, a.threads)
        Path(a.out).write_text(json.dumps(result))
        return
    if not (MODEL / "config.json").is_file():
        sys.exit(f"error: {MODEL} is not a model folder: run bash scripts/setup.sh (it imports SmolLM2)")
    contenders = tuple(who for who in CONTENDERS if who in a.only)
    print(f"P={a.prompts} n={a.n} max_tokens={a.max_tokens} turns={a.turns} calls={a.calls} reps={a.reps} "
          f"threads={a.threads}; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {who: [] for who in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            order = contenders if rep % 2 == 0 else contenders[::-1]
            for who in order:
                out = Path(tmp) / f"{who}.json"
                cmd = [sys.executable, __file__, "--worker", who, "--out", str(out), "--prompts", str(a.prompts),
                       "--n", str(a.n), "--max-tokens", str(a.max_tokens), "--turns", str(a.turns),
                       "--calls", str(a.calls), "--threads", str(a.threads)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"the {who} worker failed:\n{proc.stderr[-3000:]}")
                r = json.loads(out.read_text())
                results[who].append(r)
                print(f"  rep {rep + 1} {who}: {r['tokens']:.0f} tokens in {r['seconds']:.2f} s "
                      f"({r['tokens'] / r['seconds']:.1f} tok/s)", flush=True)  # fmt: skip
    if "vllm" in results and "driver" in results:
        same = {r["tokens"] for r in results["vllm"]} == {r["tokens"] for r in results["driver"]}
        print("driver and vllm sampled the same tokens" if same else "WARNING: driver and vllm token counts differ")
    rate = {who: statistics.median(r["tokens"] / r["seconds"] for r in results[who]) for who in contenders}
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    print(f"{'contender':<10} {'tok/s':>8} {'spread':>17} {'overhead':>9}  against (per sampled token)")
    for who in contenders:
        rates = [r["tokens"] / r["seconds"] for r in results[who]]
        base = BASELINE[who]
        overhead = f"{rate[base] / rate[who] - 1:>+9.1%}" if base in rate else f"{'-':>9}"
        print(f"{who:<10} {rate[who]:>8.1f} {min(rates):>8.1f}-{max(rates):<8.1f} {overhead}  {base}")
    print("goal (issue 43): driver within 10% of vllm")


if __name__ == "__main__":
    main()
