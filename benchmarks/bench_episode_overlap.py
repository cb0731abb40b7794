"""Episodes that do not wait for each other: a step of 64 episodes, a few of which make a 2-second tool call.

Contenders, each a fresh process per repetition (order alternating), medians over repetitions:

  generation  the same episodes with every tool instant: what the step costs without the slow calls;
  async       ``--rollout.episode_schedule async`` (each episode's next turn sampled as soon as its environment answers);
  lockstep    every turn waits for the turn's slowest environment call (the driver before issue 47).

Target (issue 47): ``async <= max(generation, slowest episode's own path) * 1.1``; the slowest episode's own path is
its 2-second call plus its turns' generation, reported as ``slow_path``.

The generation cost is real: every ``generate`` call runs the HF engine on a random 2-layer Llama over the same rows
(the tokens it samples are discarded). The *content* of the replies is scripted (a random model cannot write a tool
call on cue): every turn but the last calls ``lookup``, the last answers; slow episode ``i``'s call at turn ``i mod (turns - 1)``
takes 2 s, so that in lockstep every turn has a slow call to wait for. Environment calls run in forked worker processes
(``--rollout.environment_isolation process``), whose cost per call is reported too.

    python benchmarks/bench_episode_overlap.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("generation", "async", "lockstep")


class Lookup:
    """A tool environment whose ``lookup("slow")`` takes ``SLOW_S`` seconds."""

    SLOW_S = 2.0

    def reset(self, **row: Any) -> None:
        return None

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        if key == "slow":
            time.sleep(self.SLOW_S)
        return f"value of {key}"


def worker(who: str, episodes: int, slow: int, tokens: int, max_turns: int) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(ROOT))
    from lit_fgrpo.engines.base import SamplingConfig
    from lit_fgrpo.engines.hf import HFEngine
    from lit_fgrpo.environments import ChatTurns, EpisodeDriver, EpisodeLimits, EpisodeStart, load_environments
    from tests.environments.tiny_chat import chat_tokenizer, prompt_ids, tiny_policy

    torch.set_num_threads(1)
    tokenizer = chat_tokenizer()
    engine = HFEngine(tiny_policy(), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    sampling = SamplingConfig(n=1, max_tokens=tokens, seed=0)
    Lookup.SLOW_S = 0.0 if who == "generation" else 2.0

    def generate(prompts: list[list[int]], caps: list[int], seeds: list[int]) -> list[Any]:
        engine.generate(prompts, sampling, seeds)  # the real cost; the sampled tokens are replaced by the script
        rows = []
        for prompt in prompts:
            text = tokenizer.decode(prompt)
            turn = text.count("<|im_start|>assistant") - 1
            head = text.split("<|im_start|>user")[1][:40]  # "Question 3: ... slow key": slow at turn 3 % (turns - 1)
            number = int(head.split(":")[0].split()[-1])
            key = "slow" if "slow" in head and turn == number % (max_turns - 1) else "fast"
            reply = (
                f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'
                if turn < max_turns - 1
                else "42"
            )
            ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
            rows.append((ids, None, True))
        return rows

    environments = load_environments(Lookup)
    turns = ChatTurns(tokenizer, tools=environments.tool_schemas(""))
    driver = EpisodeDriver(
        environments, turns, EpisodeLimits(max_turns=max_turns, max_episode_tokens=512), 30.0, "process"
    )
    questions = [f"Question {i}: look up the {'slow' if i < slow else 'fast'} key." for i in range(episodes)]
    starts = [EpisodeStart(prompt_ids(q), i, {}, [{"role": "user", "content": q}]) for i, q in enumerate(questions)]
    lockstep = who == "lockstep"
    driver.run(starts, generate, lockstep=lockstep)  # warm-up: workers forked, instances made
    began = time.perf_counter()
    episodes_done = driver.run(starts, generate, lockstep=lockstep)
    seconds = time.perf_counter() - began
    assert all(e.unscorable is None and e.tool_calls["lookup"] == max_turns - 1 for e in episodes_done)
    # the cost of one environment call through a worker process: a round trip with an instant tool
    from lit_fgrpo.environments.host import Call

    (one,) = driver.pool.take(1)
    began = time.perf_counter()
    for _ in range(200):
        one.submit([Call("tool", "", "lookup", kwargs={"key": "fast"})])
        driver.pool.wait([one], None)
    per_call = (time.perf_counter() - began) / 200
    generate_seconds = driver.seconds["generate"]
    driver.close()
    return {"seconds": seconds, "generate_seconds": generate_seconds, "call_ms": per_call * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--slow", type=int, default=4, help="episodes whose tool call takes 2 s")
    parser.add_argument("--tokens", type=int, default=64, help="tokens the engine samples per row and turn")
    parser.add_argument("--turns", type=int, default=4, help="turns per episode: tool calls, then the answer")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.episodes, args.slow, args.tokens, args.turns)))
        return
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for rep in range(args.reps):
        order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
        for who in order:
            command = [sys.executable, __file__, "--worker", who, "--episodes", str(args.episodes)]
            command += ["--slow", str(args.slow), "--tokens", str(args.tokens), "--turns", str(args.turns)]
            out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            results[who].append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = {who: statistics.median(r["seconds"] for r in runs) for who, runs in results.items()}
    generation = median["generation"]
    slow_path = 2.0 + generation  # its call, and (at most) every turn's generation
    bound = max(generation, slow_path) * 1.1
    for who in CONTENDERS:
        runs = ", ".join(f"{r['seconds']:.2f}" for r in results[who])
        print(f"{who:<11} {median[who]:6.2f} s   (runs: {runs})")
    call_ms = statistics.median(r["call_ms"] for runs in results.values() for r in runs)
    print(
        f"slowest episode's own path <= {slow_path:.2f} s; target async <= {bound:.2f} s: "
        f"{'met' if median['async'] <= bound else 'NOT met'}; lockstep / async = {median['lockstep'] / median['async']:.2f}"
    )
    print(f"one environment call through a worker process: {call_ms:.2f} ms (median round trip)")


if __name__ == "__main__":
    main()
