"""Rollout throughput: vLLM vs HF ``generate`` side by side, plus the cost of one weight sync.

Models are random, built from configs (offline): a maze-like policy (~0.8M parameters) and a ~30M one.
Tokens/s counts generated completion tokens (stop tokens included) over the wall time of one warm
``generate`` call. Run: ``python benchmarks/bench_rollout.py`` (vLLM in-process, CPU KV cache 1 GiB).
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from lit_fgrpo.rollout.base import RolloutEngine, SamplingConfig  # noqa: E402
from lit_fgrpo.rollout.hf import HFEngine  # noqa: E402


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


CASES = [
    Case(
        "maze-like 0.8M",
        hidden=128,
        layers=3,
        heads=4,
        intermediate=512,
        vocab=17,
        prompt_len=94,
        prompts=16,
        n=8,
        max_tokens=32,
    ),
    Case(
        "medium ~30M",
        hidden=512,
        layers=8,
        heads=8,
        intermediate=1408,
        vocab=8000,
        prompt_len=64,
        prompts=8,
        n=8,
        max_tokens=128,
    ),
]


def build(case: Case) -> nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=case.vocab,
        hidden_size=case.hidden,
        intermediate_size=case.intermediate,
        num_hidden_layers=case.layers,
        num_attention_heads=case.heads,
        num_key_value_heads=case.heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.05,
        eos_token_id=case.vocab - 1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval()


def timed_tokens_per_s(
    engine: RolloutEngine, prompts: list[list[int]], cfg: SamplingConfig
) -> tuple[float, int, float]:
    engine.generate(prompts[:2], SamplingConfig(n=2, max_tokens=4, seed=0))  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(prompts, cfg)
    dt = time.perf_counter() - t0
    tokens = sum(len(c) for c in out.completion_ids)
    return tokens / dt, tokens, dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", nargs="*", default=[c.name.split()[0] for c in CASES])
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for case in CASES:
        if case.name.split()[0] not in args.cases:
            continue
        model = build(case)
        n_params = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(1, case.vocab - 1, (case.prompts, case.prompt_len), generator=g).tolist()
        cfg = SamplingConfig(n=case.n, temperature=1.0, max_tokens=case.max_tokens, seed=0)
        hf_tps, hf_tok, hf_dt = timed_tokens_per_s(HFEngine(model, 0, case.vocab - 1), prompts, cfg)

        from lit_fgrpo.rollout.vllm_engine import VLLMEngine

        t0 = time.perf_counter()
        engine = VLLMEngine.from_model(
            model,
            None,
            tempfile.mkdtemp(),
            eos_token_id=case.vocab - 1,
            max_model_len=case.prompt_len + case.max_tokens + 8,
        )
        start_s = time.perf_counter() - t0
        vl_tps, vl_tok, vl_dt = timed_tokens_per_s(engine, prompts, cfg)
        t0 = time.perf_counter()
        engine.sync_weights(model)
        sync_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        delta = engine.verify_sync(model)
        verify_s = time.perf_counter() - t0
        engine.close()
        rows.append(
            (case.name, n_params, hf_tps, hf_tok, hf_dt, vl_tps, vl_tok, vl_dt, start_s, sync_s, verify_s, delta)
        )

    print(f"\ntorch threads: {torch.get_num_threads()}, CPU cores: {os.cpu_count()}")
    head = f"{'model':<16} {'params':>8} {'HF tok/s':>9} {'vLLM tok/s':>10} {'vLLM/HF':>7} {'HF tok (s)':>12} {'vLLM tok (s)':>13} {'start s':>7} {'sync s':>7} {'verify s':>8} {'max|dlogp|':>10}"
    print(head)
    print("-" * len(head))
    for name, n, hf_tps, hf_tok, hf_dt, vl_tps, vl_tok, vl_dt, start_s, sync_s, verify_s, delta in rows:
        print(
            f"{name:<16} {n / 1e6:>7.2f}M {hf_tps:>9.0f} {vl_tps:>10.0f} {vl_tps / hf_tps:>7.2f} "
            f"{hf_tok:>5} ({hf_dt:>4.1f}) {vl_tok:>6} ({vl_dt:>4.1f}) {start_s:>7.1f} {sync_s:>7.3f} {verify_s:>8.3f} {delta:>10.2e}"
        )


if __name__ == "__main__":
    main()
