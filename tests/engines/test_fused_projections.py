"""Fused projections in bfloat16: q/k/v and gate/up through one prepared copy, in the lean step and in the prefill.

References: each member's ``float(bf16(x) · bf16(W)ᵀ)`` computed alone (exact products of the rounded operands, and
plain ``F.linear``); the model's own forward with every projection made that way (``bf16_reference``). The sampling
log-probs of the fused decoding against that reference are checked in ``test_prepared_weights.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.lean_weights import fusable_groups, lean_weights
from lit_fgrpo.engines.prepared_weights import PreparedWeights, packing_works
from tests.engines.test_hf import prompts
from tests.engines.test_lean_step import lora_model
from tests.engines.test_prepared_weights import Bf16Linear, bf16_reference
from tests.tiny_models import EOS, PAD, hf_engine_model


@pytest.mark.parametrize("pack", [False, True])
def test_each_member_of_a_group_gets_its_own_bfloat16_product(pack: bool) -> None:
    if pack and not packing_works(torch.bfloat16):
        pytest.skip("no oneDNN bfloat16 packed linear here")
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(out, 32, generator=g) for out in (48, 16, 16)]  # (out_i, in) each
    x = torch.randn(2, 5, 32, generator=g)  # (R, T, in): the prefill's 3-D input
    run = PreparedWeights(torch.bfloat16, pack=pack).get_group(weights)
    assert run is not None
    outs = run(x)
    assert [tuple(o.shape) for o in outs] == [(2, 5, 48), (2, 5, 16), (2, 5, 16)]
    for out, weight in zip(outs, weights):
        assert out.dtype == torch.float32
        exact = x.bfloat16().double() @ weight.bfloat16().double().T  # (R, T, out_i)
        torch.testing.assert_close(out.double(), exact, rtol=2**-8, atol=1e-6)
    assert PreparedWeights(None).get_group(weights) is None  # float32 keeps the separate copies


def test_a_group_copy_follows_in_place_changes_and_leaves_at_release_when_it_trains() -> None:
    frozen = [torch.randn(8, 4), torch.randn(6, 4)]
    trained = [nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(6, 4))]
    prepared = PreparedWeights(torch.bfloat16)
    first = prepared.get_group(frozen)
    assert first is not None and prepared.get_group(frozen) is first
    with torch.no_grad():
        frozen[1].mul_(-3.0)
    second = prepared.get_group(frozen)
    assert second is not None and second is not first
    x = torch.randn(3, 4)
    torch.testing.assert_close(second(x)[1], F.linear(x.bfloat16(), frozen[1].bfloat16()).float())
    assert prepared.get_group(trained) is not None
    both = prepared.held_bytes()
    prepared.release_trainable()
    assert 0 < prepared.held_bytes() < both and prepared.get_group(frozen) is second


def test_the_prefill_shares_one_product_per_group_and_matches_the_bfloat16_model() -> None:
    model = hf_engine_model("llama").eval()
    groups = fusable_groups(model)
    layers = model.config.num_hidden_layers
    assert [len(group) for group in groups] == [3, 2] * layers
    ids = torch.tensor([prompts(2)[0], prompts(2)[1][: len(prompts(2)[0])]])
    prepared = PreparedWeights(torch.bfloat16)
    with torch.no_grad(), prepared.swapped_into(model, groups):
        got = model(input_ids=ids).logits
        q, k, v = groups[0]
        x1, x2 = torch.randn(3, q.in_features), torch.randn(3, q.in_features)
        # out of the model's order, a member twice, a new input between: each call still gets its own product
        calls = [(k, x1), (q, x2), (v, x1), (k, x1), (q, x1)]
        answers = [member(x) for member, x in calls]
    with torch.no_grad():
        want = bf16_reference(model)(input_ids=ids).logits
        for (member, x), answer in zip(calls, answers):
            torch.testing.assert_close(answer, Bf16Linear(member)(x))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert all("forward" not in vars(m) for group in groups for m in group)  # restored


def test_bfloat16_decoding_fuses_and_holds_each_frozen_weight_once() -> None:
    model = lora_model().eval()
    assert lean_weights(model, PreparedWeights(None)).layers[0].qkv is None  # type: ignore[union-attr]
    fused = lean_weights(model, PreparedWeights(torch.bfloat16))
    assert fused is not None and all(layer.qkv is not None and layer.gate_up is not None for layer in fused.layers)
    engine = HFEngine(model, PAD, EOS, decode_dtype="bfloat16")
    engine.generate(prompts(2), SamplingConfig(n=2, max_tokens=4, seed=1))
    prepared = engine.prepared_weights()
    assert prepared is not None
    frozen = [m.weight for m in model.modules() if type(m) is nn.Linear and not m.weight.requires_grad]
    bf16_bytes = sum(w.numel() * 2 for w in frozen)
    # every frozen projection and the output layer in one bfloat16 copy: not the separate copies and the fused ones
    assert 0.9 * bf16_bytes <= prepared.held_bytes() <= 1.2 * bf16_bytes
