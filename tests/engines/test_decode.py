"""The HF engine's own sampling loop against ``model.generate`` with the same row sampler (the reference).

Same model, prompts, seeds and settings through both paths of :class:`HFEngine` (``own_loop=False`` is the
``generate`` path): the tokens, stop flags and sampling log-probs must agree, while the loop prefills each prompt
once, writes its KV cache in place and drops finished rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.decode import PreallocatedLayer, supports_own_loop
from lit_fgrpo.engines.hf import HFEngine
from tests.engines.test_hf import prompts
from tests.tiny_models import EOS, PAD, hf_engine_model


def both(model: nn.Module, prompt_ids: list[list[int]], sampling: SamplingConfig) -> tuple[Any, Any]:
    """(own loop, generate) generations of the same call."""
    own = HFEngine(model, PAD, EOS).generate(prompt_ids, sampling)
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(prompt_ids, sampling)
    return own, ref


def assert_same(own: Any, ref: Any) -> None:
    assert own.completion_ids == ref.completion_ids
    assert own.finished == ref.finished
    for a, b in zip(own.sampling_logprobs, ref.sampling_logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)


def batch_sizes(model: nn.Module) -> list[int]:
    """Records the batch size of every forward of ``model`` (a hook on its input embeddings)."""
    sizes: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: sizes.append(int(args[0].shape[0])))
    return sizes


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(n=4, max_tokens=12, temperature=1.0, seed=5),
        SamplingConfig(n=3, max_tokens=9, temperature=0.7, top_k=10, top_p=0.9, seed=2, stop_token_ids=[5, 6, 7]),
    ],
)
def test_own_loop_draws_the_tokens_of_generate(kind: str, sampling: SamplingConfig) -> None:
    model = hf_engine_model(kind)
    assert supports_own_loop(model)
    own, ref = both(model, prompts(4), sampling)  # prompts of 2 to 8 tokens: left padding
    assert_same(own, ref)
    assert len(own.completion_ids) == 4 * sampling.n


def test_prompts_are_prefilled_once_and_finished_rows_leave_the_batch() -> None:
    model = hf_engine_model()
    sizes = batch_sizes(model)
    stops = list(range(3, 40))  # most tokens stop: rows finish at different steps
    sampling = SamplingConfig(n=4, max_tokens=10, seed=0, stop_token_ids=stops)
    own = HFEngine(model, PAD, EOS).generate(prompts(3), sampling)
    assert sizes[0] == 3  # the prefill: one row per prompt, not 3 x 4
    assert sizes[1:] == sorted(sizes[1:], reverse=True) and sizes[1] <= 12
    lengths = [len(c) for c in own.completion_ids]
    assert len(sizes) - 1 == max(lengths) - 1  # one decoding forward per step after the first, none after the last
    assert sizes[-1] == sum(n >= len(sizes) for n in lengths)  # the last forward holds only the rows still going
    assert any(own.finished) and min(lengths) < max(lengths)
    sizes.clear()
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(prompts(3), sampling)
    assert_same(own, ref)
    assert sizes[0] == 12  # generate prefills every row


def test_models_with_sliding_window_caches_stay_on_generate() -> None:
    from transformers import AutoModelForCausalLM, MistralConfig

    config = MistralConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=4096, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    assert not supports_own_loop(model)
    sampling = SamplingConfig(n=2, max_tokens=6, seed=1)
    own, ref = both(model, prompts(2), sampling)
    assert_same(own, ref)  # both went through generate


def test_an_empty_prompt_goes_through_generate() -> None:
    model = hf_engine_model()
    sizes = batch_sizes(model)
    HFEngine(model, PAD, EOS).generate([[], [4, 5]], SamplingConfig(n=2, max_tokens=4, seed=0))
    assert sizes[0] == 4  # generate's prefill of all rows: the own loop needs a last prompt token per row


def test_preallocated_layer_writes_in_place_and_selects_rows() -> None:
    layer = PreallocatedLayer(extra=2)
    k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)  # (b, heads, n, d)
    keys, values = layer.update(k, v)
    torch.testing.assert_close(keys, k)
    k2, v2 = torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4)
    keys, values = layer.update(k2, v2)
    torch.testing.assert_close(keys, torch.cat([k, k2], dim=2))
    torch.testing.assert_close(values, torch.cat([v, v2], dim=2))
    assert layer.get_seq_length() == 4
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    torch.testing.assert_close(layer.keys, torch.cat([k, k2], dim=2)[[1, 1, 0]])
    layer.update(torch.randn(3, 1, 1, 4), torch.randn(3, 1, 1, 4))
    with pytest.raises(RuntimeError, match="exceed its buffer"):
        layer.update(torch.randn(3, 1, 1, 4), torch.randn(3, 1, 1, 4))


def test_chunks_that_split_a_prompts_rows_match_generate() -> None:
    model = hf_engine_model()
    sampling = SamplingConfig(n=4, max_tokens=8, seed=3, stop_token_ids=[5, 6])
    own = HFEngine(model, PAD, EOS, chunk_size=5).generate(prompts(3), sampling)  # chunks of 5 rows: 4 + 1, 3 + 2, ...
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(prompts(3), sampling)
    assert_same(own, ref)
