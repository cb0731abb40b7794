"""HFEngine on CUDA in bf16 (skipped without a GPU; never faked)."""

from __future__ import annotations

import pytest
import torch

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_hf_engine_bf16_cuda() -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.15,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to("cuda", torch.bfloat16)
    model.train()
    engine = HFEngine(model, pad_token_id=0, eos_token_id=1, chunk_size=16)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    cfg = SamplingConfig(n=16, temperature=1.0, max_tokens=24, seed=0)
    out = engine.generate(prompts, cfg)
    assert model.training
    assert len(out.completion_ids) == 32 and out.sampling_logprobs is not None
    assert engine.generate(prompts, cfg).completion_ids == out.completion_ids
    for row, (ids, lps) in enumerate(zip(out.completion_ids, out.sampling_logprobs)):
        assert len(ids) == len(lps) and all(lp <= 0 for lp in lps)
        assert out.finished[row] == (ids[-1] == 1)
    scored = engine.score([prompts[r // 16] for r in range(32)], out.completion_ids)
    for s, lps in zip(scored, out.sampling_logprobs):
        # bf16: batched generation and a padded teacher-forced pass differ by rounding only
        assert (s - torch.tensor(lps)).abs().max().item() < 0.1
