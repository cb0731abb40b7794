"""The HF engine's lean decoding step against the model's own forward (the reference path).

Reference: teacher forcing through HF's forward on the whole sequence, and the engine's ``generate`` path with the
same row sampler. The lean step must give the same tokens for the same seeds and log-probs within 1e-5 (float32
rounding of other kernels: the grouped-query attention without head copies, the shared prompt cache), for Llama,
Qwen2, Qwen3 and a PEFT LoRA policy, with rows finishing at different steps; anything it cannot reproduce keeps the
model's forward.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.decode import left_pad
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.lean_step import SharedPromptCache, decode_step
from lit_fgrpo.engines.lean_weights import lean_weights
from tests.engines.test_hf import prompts
from tests.tiny_models import BOS, EOS, HF_ENGINE_VOCAB, PAD, hf_engine_model, tiny_causal_lm

LOGPROB_DRIFT = 1e-5
"""Largest |lean - reference| sampling log-prob allowed on the tiny models (float32 rounding)."""


def qwen3_model() -> nn.Module:
    """A 2-layer Qwen3 (per-head q/k norms), shaped like :func:`hf_engine_model`."""
    return tiny_causal_lm(
        "qwen3", vocab_size=HF_ENGINE_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        initializer_range=0.15, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    )  # fmt: skip


def lora_model(**lora: Any) -> nn.Module:
    """:func:`hf_engine_model` with LoRA on its 7 projections, the adapters non-zero (B is not left at 0)."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, **lora)
    return get_peft_model(hf_engine_model("llama"), config)


MODELS = {
    "llama": lambda: hf_engine_model("llama"),
    "qwen2": lambda: hf_engine_model("qwen2"),
    "qwen3": qwen3_model,
    "lora": lora_model,
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_decode_steps_give_the_logits_of_the_full_forward(kind: str) -> None:
    model = MODELS[kind]().eval()
    weights = lean_weights(model)
    assert weights is not None
    ps, rows = prompts(3), torch.tensor([0, 0, 1, 1, 1, 2])  # prompts of 2 to 8 tokens: left padding
    ids, attn = left_pad(ps, PAD, torch.device("cpu"))  # (P, L)
    positions = (attn.cumsum(1) - 1).clamp(min=0)  # (P, L)
    g = torch.Generator().manual_seed(0)
    new = torch.randint(3, HF_ENGINE_VOCAB, (rows.shape[0], 4), generator=g)  # (R, 4) forced completion tokens
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True)
        layers: list[Any] = list(out.past_key_values.layers)
        cache = SharedPromptCache([x.keys for x in layers], [x.values for x in layers], attn, rows, max_tokens=4)
        lean = [decode_step(weights, cache, new[:, t], positions[rows, -1] + 1 + t) for t in range(4)]  # (R, V) each
        for r, p in enumerate(rows.tolist()):
            full = model(input_ids=torch.tensor([ps[p] + new[r].tolist()])).logits[0, len(ps[p]) :]  # (4, V)
            torch.testing.assert_close(torch.stack([x[r] for x in lean]), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_lean_loop_draws_the_tokens_of_the_reference_paths(kind: str) -> None:
    model = MODELS[kind]()
    stops = list(range(3, 9))  # stop tokens: rows finish at different steps and leave the batch
    sampling = SamplingConfig(n=4, max_tokens=12, temperature=0.9, seed=7, stop_token_ids=stops)
    lean = HFEngine(model, PAD, EOS).generate(prompts(4), sampling)
    for reference in (HFEngine(model, PAD, EOS, lean=False), HFEngine(model, PAD, EOS, own_loop=False)):
        ref = reference.generate(prompts(4), sampling)
        assert lean.completion_ids == ref.completion_ids and lean.finished == ref.finished
        assert lean.sampling_logprobs is not None and ref.sampling_logprobs is not None
        for a, b in zip(lean.sampling_logprobs, ref.sampling_logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=LOGPROB_DRIFT, rtol=0)
    lengths = {len(c) for c in lean.completion_ids}
    assert len(lengths) > 2 and any(lean.finished) and not all(lean.finished)


def test_the_lean_step_follows_the_weights_as_they_change() -> None:
    # It reads the live parameters (no copy): after an in-place update the engine samples from the new weights.
    model = lora_model()
    sampling = SamplingConfig(n=3, max_tokens=8, seed=1)
    before = HFEngine(model, PAD, EOS).generate(prompts(2), sampling)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)
    after = HFEngine(model, PAD, EOS).generate(prompts(2), sampling)
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(prompts(2), sampling)
    assert after.completion_ids == ref.completion_ids != before.completion_ids


def test_what_the_lean_step_cannot_reproduce_keeps_the_models_forward() -> None:
    assert lean_weights(lora_model(use_dora=True)) is None  # DoRA rescales the merged weight
    gelu = tiny_causal_lm("llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, hidden_act="gelu")  # fmt: skip
    assert lean_weights(gelu) is None
    phi = tiny_causal_lm("phi3", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)  # fmt: skip
    assert lean_weights(phi) is None
    sampling = SamplingConfig(n=2, max_tokens=5, seed=3)
    model = lora_model(use_dora=True)
    own = HFEngine(model, PAD, EOS).generate(prompts(2), sampling)  # through the model's forward, not the lean step
    ref = HFEngine(model, PAD, EOS, own_loop=False).generate(prompts(2), sampling)
    assert own.completion_ids == ref.completion_ids
