"""The ``vllm_server`` engine against the colocated ``vllm`` engine: K steps of sample -> update -> push, same seeds.

Two copies of one policy train side by side in this process, one sampling from a launched ``vllm serve`` (weights
pushed as files) and one from an in-process ``VLLMEngine`` (weights loaded in memory). Both send each prompt with its
own seed to the same vLLM sampler, so every step must give the same token ids; the trainer side (the loss, the
backward, AdamW) is then the same computation on the same inputs in one process, so the final weights must be equal
to the bit. A push that left any tensor stale on either side would change the next step's samples.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import Generation, SamplingConfig
from tests.tiny_models import EOS, vllm_model, vllm_tokenizer

# vllm-marked: tests/conftest.py skips these without vLLM and under ATEN_CPU_CAPABILITY=default
pytestmark = pytest.mark.vllm

STEPS = 3
PROMPTS = [[5 + (i * 11 + j) % 80 for j in range(3 + i % 4)] for i in range(6)]
SEEDS = [500 + 31 * i for i in range(len(PROMPTS))]
SAMPLING = SamplingConfig(n=4, temperature=1.0, max_tokens=8)


def reward(completion: list[int]) -> float:
    """A verifiable toy reward: the fraction of even token ids (groups get mixed scores, so advantages are not 0)."""
    return sum(1 for t in completion if t % 2 == 0) / max(len(completion), 1)


def policy_gradient_step(model: nn.Module, opt: torch.optim.Optimizer, generation: Generation) -> None:
    """One group-normalised REINFORCE step on the rollout: loss = -mean_i A_i * sum_t log p(y_it)."""
    n = SAMPLING.n
    rewards = torch.tensor([reward(c) for c in generation.completion_ids]).view(-1, n)  # (P, G)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()  # (B,)
    model.train()
    losses = []
    for row, completion in enumerate(generation.completion_ids):
        prompt = PROMPTS[row // n]
        ids = torch.tensor([prompt + list(completion)])  # (1, T)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)  # (T-1, V)
        token_lp = logp[len(prompt) - 1 :].gather(1, ids[0, len(prompt) :, None]).sum()
        losses.append(-adv[row] * token_lp)
    torch.stack(losses).mean().backward()
    opt.step()
    opt.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, nn.Module, nn.Module]]:
    from lit_fgrpo.engines.vllm_engine import VLLMEngine
    from lit_fgrpo.servers.engine import ServerEngine

    on_server = vllm_model("qwen2", tied=True).eval()
    colocated = copy.deepcopy(on_server)
    server = ServerEngine.from_model(
        on_server, vllm_tokenizer(), tmp_path_factory.mktemp("server"), eos_token_id=EOS, launch=1,
        startup_timeout_s=240, max_model_len=256,
    )  # fmt: skip
    local = VLLMEngine.from_model(colocated, vllm_tokenizer(), tmp_path_factory.mktemp("colocated"), max_model_len=256)
    yield server, local, on_server, colocated
    server.close()
    local.close()


def test_k_steps_on_a_server_equal_k_steps_on_the_colocated_engine(
    engines: tuple[Any, Any, nn.Module, nn.Module],
) -> None:
    server, local, on_server, colocated = engines
    opts = [torch.optim.AdamW(m.parameters(), lr=0.02) for m in (on_server, colocated)]
    for step in range(STEPS):
        server.sync_weights(on_server)
        local.sync_weights(colocated)
        a = server.generate(PROMPTS, SAMPLING, seeds=SEEDS)
        b = local.generate(PROMPTS, SAMPLING, seeds=SEEDS)
        assert [list(c) for c in a.completion_ids] == [list(c) for c in b.completion_ids], f"step {step}"
        for lp_a, lp_b in zip(a.sampling_logprobs, b.sampling_logprobs):
            assert torch.allclose(torch.as_tensor(lp_a), torch.as_tensor(lp_b), atol=1e-4)  # same fp32 kernels
        policy_gradient_step(on_server, opts[0], a)
        policy_gradient_step(colocated, opts[1], b)
    moved = max((p - q).abs().max().item() for p, q in zip(on_server.parameters(), vllm_model("qwen2").parameters()))
    assert moved > 1e-3  # the steps did move the policy, so equal samples after them mean the pushes arrived
    for (name, p), q in zip(on_server.named_parameters(), colocated.parameters()):
        assert torch.equal(p, q), name
