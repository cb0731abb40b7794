"""Prepared weights for the lean step: oneDNN-packed copies and bfloat16 decoding, against plain references.

References: ``F.linear`` on the weight itself (packing must not change the numbers beyond float32 rounding); for
bfloat16, the same model with every projection computing ``float(bf16(x) · bf16(W)ᵀ)`` through plain ``F.linear``
and scored by teacher forcing: the engine's sampling log-probs must be that policy's. A prepared copy must follow
every in-place change of its weight, and the copies of trainable weights leave at ``sleep``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.prepared_weights import PreparedWeights, native_bf16, packing_works, resolve_decode_dtype
from lit_fgrpo.engines.trainer_logprobs import policy_logprobs
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from tests.engines.test_hf import prompts
from tests.engines.test_lean_step import lora_model
from tests.tiny_models import EOS, PAD, hf_engine_model

needs_packing = pytest.mark.skipif(not packing_works(torch.float32), reason="no oneDNN packed linear in this torch")


class Bf16Linear(nn.Module):
    """The reference for a bfloat16 projection: ``float(bf16(x) · bf16(W)ᵀ) + b`` with plain ``F.linear``."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16)).to(x.dtype)
        return out if self.bias is None else out + self.bias


def bf16_reference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every plain ``nn.Linear`` (LoRA's base layers included, its adapters not: they stay
    float32) is a :class:`Bf16Linear`."""
    ref = copy.deepcopy(model)
    for module in list(ref.modules()):
        if isinstance(module, nn.ModuleDict):  # PEFT's lora_A / lora_B: the adapters
            continue
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Bf16Linear(child))
    return ref.eval()


@needs_packing
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_a_packed_frozen_weight_gives_f_linear_numbers(rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 48, generator=g).requires_grad_(False)  # (out, in)
    x = torch.randn(rows, 48, generator=g)  # (R, in)
    run = PreparedWeights(None).get(weight)
    assert run is not None
    torch.testing.assert_close(run(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run(x.view(1, rows, 48)), F.linear(x, weight).view(1, rows, 96), atol=1e-5, rtol=1e-5)


def test_a_trainable_float32_weight_is_used_as_it_is() -> None:
    # Packing costs about a read and a write of the weight: for a weight the next optimizer step changes, not worth it
    weight = nn.Parameter(torch.randn(8, 4))
    prepared = PreparedWeights(None)
    assert prepared.get(weight) is None and prepared.prepared == 0


@pytest.mark.parametrize("pack", [False, True])
def test_bfloat16_projection_rounds_input_and_weight_and_returns_float32(pack: bool) -> None:
    if pack and not packing_works(torch.bfloat16):
        pytest.skip("no oneDNN bfloat16 packed linear here")
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(64, 32, generator=g), torch.randn(7, 32, generator=g)  # (out, in), (R, in)
    run = PreparedWeights(torch.bfloat16, pack=pack).get(weight)
    assert run is not None
    out = run(x)
    assert out.dtype == torch.float32
    exact = x.bfloat16().double() @ weight.bfloat16().double().T  # (R, out) the rounded operands, exact products
    # float32 accumulation, then the kernel's bfloat16 output: within one bfloat16 ulp (2^-8 relative)
    torch.testing.assert_close(out.double(), exact, rtol=2**-8, atol=1e-6)
    assert (out.double() - x.double() @ weight.double().T).abs().max() > 0  # it is rounded: not float32's numbers


def test_a_copy_follows_every_in_place_change_of_its_weight() -> None:
    weight = torch.randn(16, 8)
    prepared = PreparedWeights(torch.bfloat16)
    x = torch.randn(3, 8)
    first = prepared.get(weight)
    assert first is not None and prepared.get(weight) is first and prepared.prepared == 1  # unchanged: kept
    with torch.no_grad():
        weight.mul_(-2.0)  # an optimizer step, a push: in place, the version counter moves
    second = prepared.get(weight)
    assert second is not first and prepared.prepared == 2
    torch.testing.assert_close(second(x), F.linear(x.bfloat16(), weight.bfloat16()).float())


def test_release_drops_the_trainable_copies_and_keeps_the_frozen_ones() -> None:
    frozen, trained = torch.randn(32, 16), nn.Parameter(torch.randn(32, 16))
    prepared = PreparedWeights(torch.bfloat16)
    assert prepared.get(frozen) is not None and prepared.get(trained) is not None
    both = prepared.held_bytes()
    prepared.release_trainable()
    assert 0 < prepared.held_bytes() < both
    assert prepared.prepared == 2
    prepared.get(frozen)
    assert prepared.prepared == 2  # the frozen copy was kept


def test_swapping_into_a_model_restores_its_forward_even_after_an_error() -> None:
    model = lora_model().eval()
    linear = next(m for m in model.modules() if type(m) is nn.Linear)
    x = torch.randn(2, linear.in_features)
    prepared = PreparedWeights(torch.bfloat16)
    with pytest.raises(RuntimeError, match="inside"), prepared.swapped_into(model):
        assert torch.equal(linear(x), Bf16Linear(linear)(x))
        raise RuntimeError("inside")
    assert "forward" not in vars(linear)
    torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias))


@pytest.mark.parametrize("kind", ["llama", "lora"])
def test_packed_float32_decoding_draws_the_unpacked_tokens(kind: str) -> None:
    model = (lora_model() if kind == "lora" else hf_engine_model("llama").requires_grad_(False)).eval()
    sampling = SamplingConfig(n=4, max_tokens=10, temperature=0.9, seed=5, stop_token_ids=[3, 4, 5])
    packed = HFEngine(model, PAD, EOS)
    plain = HFEngine(model, PAD, EOS, pack_weights=False)
    a, b = packed.generate(prompts(4), sampling), plain.generate(prompts(4), sampling)
    assert a.completion_ids == b.completion_ids
    assert a.sampling_logprobs is not None and b.sampling_logprobs is not None
    for x, y in zip(a.sampling_logprobs, b.sampling_logprobs):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-5, rtol=0)
    prepared = packed.prepared_weights()
    assert prepared is not None and prepared.prepared > 0 and plain.prepared_weights() is None


@pytest.mark.parametrize("kind", ["llama", "lora"])
def test_bfloat16_decoding_samples_from_the_bfloat16_policy(kind: str) -> None:
    model = (lora_model() if kind == "lora" else hf_engine_model("llama")).eval()
    sampling = SamplingConfig(n=4, max_tokens=10, temperature=1.0, seed=9)
    engine = HFEngine(model, PAD, EOS, decode_dtype="bfloat16")
    out = engine.generate(prompts(4), sampling)
    assert out.sampling_logprobs is not None
    rows = [p for p in prompts(4) for _ in range(4)]
    ref = policy_logprobs(bf16_reference(model), rows, out.completion_ids, PAD)  # the bfloat16 policy, teacher forced
    fp32 = policy_logprobs(model, rows, out.completion_ids, PAD)
    got = torch.cat([torch.tensor(x) for x in out.sampling_logprobs])
    want, full = torch.cat(ref), torch.cat(fp32)
    # The same policy through other kernels (the lean step, the prefill's shared prefix): float32 differences that
    # now and then move an input across a bfloat16 rounding boundary, so a few tokens differ by up to ~0.01.
    gap = (got - want).abs()
    assert gap.mean() < 1e-3 and gap.max() < 0.02
    drift = (got - full).abs()
    assert 0.002 < drift.mean() < 0.05  # what bfloat16 costs against the trainer's float32 log-probs on this model
    assert drift.mean() > 10 * gap.mean()


def test_bfloat16_decoding_follows_the_optimizer_and_sleep_frees_the_trained_copies() -> None:
    model = hf_engine_model("llama")
    engine = HFEngine(model, PAD, EOS, decode_dtype="bfloat16")
    sampling = SamplingConfig(n=2, max_tokens=6, seed=2)
    engine.generate(prompts(2), sampling)
    prepared = engine.prepared_weights()
    assert prepared is not None and prepared.held_bytes() > 0
    engine.sleep()  # before the optimizer step
    assert prepared.held_bytes() == 0  # every weight trains here
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=torch.tensor([prompts(1)[0]])).logits.square().mean().backward()
    optimizer.step()
    out = engine.generate(prompts(2), sampling)
    assert out.sampling_logprobs is not None
    rows = [p for p in prompts(2) for _ in range(2)]
    ref = policy_logprobs(bf16_reference(model), rows, out.completion_ids, PAD)  # the updated weights, in bfloat16
    gap = (torch.cat([torch.tensor(x) for x in out.sampling_logprobs]) - torch.cat(ref)).abs()
    assert gap.mean() < 1e-3 and gap.max() < 0.02


def test_the_decode_dtype_setting_resolves_and_names_its_flag() -> None:
    cpu = torch.device("cpu")
    assert resolve_decode_dtype("float32", cpu) is None
    assert resolve_decode_dtype("bfloat16", cpu) is torch.bfloat16
    assert resolve_decode_dtype("auto", cpu) is (torch.bfloat16 if native_bf16(cpu) else None)
    with pytest.raises(ConfigError, match="--rollout.decode_dtype must be one of float32, bfloat16, auto"):
        resolve_decode_dtype("fp8", cpu)
    with pytest.raises(ConfigError, match="decode_dtype must be one of"):
        HFEngine(hf_engine_model("llama"), PAD, EOS, decode_dtype="half")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="decode_dtype 'bfloat16' is for the HF engines.*engine_kwargs.dtype"):
        RolloutSettings(engine="vllm", decode_dtype="bfloat16")


@pytest.mark.parametrize("kind", ["hf", "hf_copy"])
def test_the_rollout_settings_reach_the_engine(kind: str) -> None:
    from lit_fgrpo.rollout.engine_select import build_engine

    model = lora_model()
    settings = RolloutSettings(engine=kind, decode_dtype="bfloat16", pack_weights=False)
    engine: Any = build_engine(
        kind, model, None, pad_token_id=PAD, eos_token_id=EOS, decode_dtype=settings.decode_dtype,
        pack_weights=settings.pack_weights,
    )  # fmt: skip
    prepared = engine.prepared_weights()
    assert prepared is not None and prepared.dtype is torch.bfloat16 and not prepared.pack
    packs = build_engine("hf", model, None, pad_token_id=PAD, eos_token_id=EOS).prepared_weights()  # type: ignore[attr-defined]
    assert packs is not None and packs.pack
    # an engine with a copy of its own never packs: its copy changes at every push
    own = build_engine("hf_copy", model, None, pad_token_id=PAD, eos_token_id=EOS).prepared_weights()  # type: ignore[attr-defined]
    assert own is None


@needs_packing
def test_a_frozen_weight_changed_in_place_is_packed_again_with_its_new_values() -> None:
    # the same kernel on every call (a resumed run must draw what the straight run drew), and never stale values
    weight = torch.randn(24, 16).requires_grad_(False)
    x = torch.randn(3, 16)
    prepared = PreparedWeights(None)
    first = prepared.get(weight)
    with torch.no_grad():
        weight.copy_(torch.randn(24, 16))  # a push, a load
    second = prepared.get(weight)
    assert first is not None and second is not None and second is not first and prepared.prepared == 2
    torch.testing.assert_close(second(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)
