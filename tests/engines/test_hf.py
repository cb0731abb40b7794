"""HFEngine: prompt-major shapes, stop handling, sampling log-probs, seeding, train-mode restore."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from tests.tiny_models import EOS, HF_ENGINE_VOCAB, PAD, hf_engine_model


def prompts(p: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [
        torch.randint(3, HF_ENGINE_VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(p)
    ]


def teacher_forced(model: nn.Module, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """Unbatched reference: log_softmax(logits / T) at the completion tokens, (T_c,)."""
    ids = torch.tensor([prompt + completion])  # (1, L)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0, :-1]  # (L-1, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)  # (L-1, V)
    return logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)[len(prompt) - 1 :]  # (T_c,)


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return hf_engine_model("llama")


def test_engine_interface(llama: nn.Module) -> None:
    import inspect

    engine = HFEngine(llama, PAD, EOS)
    assert isinstance(engine, RolloutEngine)
    # one score signature for every engine (the sync check calls score(..., temperature=1.0))
    assert inspect.signature(HFEngine.score) == inspect.signature(RolloutEngine.score)
    engine.sleep(), engine.wake_up(), engine.close()  # the base class's no-op defaults
    with pytest.raises(TypeError, match="abstract"):
        RolloutEngine()  # type: ignore[abstract]


def test_shapes_prompt_major_and_stop(llama: nn.Module) -> None:
    engine = HFEngine(llama, pad_token_id=PAD, eos_token_id=EOS, chunk_size=5)  # forces 3 chunks of rows
    stops = [EOS, 7, 9]
    # a hot temperature on a 64-token vocab: stops and the (non-stop) pad id both get sampled
    cfg = SamplingConfig(n=4, temperature=3.0, max_tokens=24, stop_token_ids=[7, 9], seed=5)  # 5 pads mid-row
    ps = prompts(3)
    out = engine.generate(ps, cfg)
    assert len(out.completion_ids) == len(out.finished) == 12
    assert out.sampling_logprobs is not None and len(out.sampling_logprobs) == 12
    for ids, lps, done in zip(out.completion_ids, out.sampling_logprobs, out.finished):
        assert 1 <= len(ids) <= cfg.max_tokens and len(lps) == len(ids)
        assert all(t not in stops for t in ids[:-1])  # cut at the FIRST stop token
        assert done == (ids[-1] in stops)
        assert done or len(ids) == cfg.max_tokens
    assert any(out.finished) and not all(out.finished)
    # pad (not a stop) may be sampled mid-sequence and must be kept
    assert any(PAD in ids[:-1] for ids in out.completion_ids)
    # prompt-major: rows i*n..i*n+n-1 are prompt i's samples; checked via teacher forcing per prompt
    for row in (0, 5, 11):
        ref = teacher_forced(llama, ps[row // cfg.n], out.completion_ids[row], cfg.temperature)
        torch.testing.assert_close(torch.tensor(out.sampling_logprobs[row]), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_sampling_logprobs_match_teacher_forcing(kind: str) -> None:
    model = hf_engine_model(kind)
    engine = HFEngine(model, pad_token_id=PAD, eos_token_id=EOS)
    # top-k / top-p shape the sampler, but the reported log-probs are the policy's at temperature T
    cfg = SamplingConfig(n=3, temperature=0.7, top_p=0.9, top_k=20, max_tokens=12, seed=0)
    ps = prompts(4)
    out = engine.generate(ps, cfg)
    assert out.sampling_logprobs is not None
    for row, (ids, lps) in enumerate(zip(out.completion_ids, out.sampling_logprobs)):
        ref = teacher_forced(model, ps[row // cfg.n], ids, cfg.temperature)
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-4, rtol=0)
    scored = engine.score([ps[r // cfg.n] for r in range(len(out.completion_ids))], out.completion_ids, temperature=0.7)
    for s, lps in zip(scored, out.sampling_logprobs):
        torch.testing.assert_close(s, torch.tensor(lps), atol=1e-4, rtol=0)


def test_seed_determinism_and_global_rng_untouched(llama: nn.Module) -> None:
    engine = HFEngine(llama, pad_token_id=PAD, eos_token_id=EOS)
    cfg = SamplingConfig(n=4, temperature=1.0, max_tokens=16, seed=123)
    state = torch.get_rng_state()
    a = engine.generate(prompts(2), cfg)
    assert torch.equal(state, torch.get_rng_state())
    b = engine.generate(prompts(2), cfg)
    c = engine.generate(prompts(2), SamplingConfig(n=4, temperature=1.0, max_tokens=16, seed=124))
    assert a.completion_ids == b.completion_ids and a.sampling_logprobs == b.sampling_logprobs
    assert a.completion_ids != c.completion_ids


def test_training_mode_restored(llama: nn.Module) -> None:
    engine = HFEngine(llama, pad_token_id=PAD, eos_token_id=EOS)
    cfg = SamplingConfig(n=2, max_tokens=4, seed=0)
    for mode in (True, False):
        llama.train(mode)
        engine.generate(prompts(1), cfg)
        engine.score([[3, 4]], [[5, 6]])
        assert llama.training is mode
        assert all(m.training is mode for m in llama.modules())
    assert all(p.grad is None for p in llama.parameters())
    engine.sync_weights(llama)  # no-op
    assert engine.model is llama


def test_a_prompt_gets_the_same_completions_whatever_else_is_in_the_call(llama: nn.Module) -> None:
    # What per-prompt seeds buy: prompt i's samples depend on seeds[i] and the weights only, not on the other
    # prompts of the call, the chunking or the order (so not on the rank layout). Reference: each prompt alone.
    cfg = SamplingConfig(n=3, temperature=1.5, top_k=40, top_p=0.95, max_tokens=10, seed=None)
    ps, seeds = prompts(4), [11, 22, 33, 44]
    alone = [HFEngine(llama, PAD, EOS).generate([p], cfg, [s]) for p, s in zip(ps, seeds)]
    together = HFEngine(llama, PAD, EOS, chunk_size=5).generate(ps, cfg, seeds)  # chunks split prompts' groups
    reordered = HFEngine(llama, PAD, EOS).generate(ps[::-1], cfg, seeds[::-1])
    for i, single in enumerate(alone):
        rows = slice(i * cfg.n, (i + 1) * cfg.n)
        back = slice((3 - i) * cfg.n, (4 - i) * cfg.n)
        assert together.completion_ids[rows] == single.completion_ids == reordered.completion_ids[back]
        assert together.sampling_logprobs is not None and single.sampling_logprobs is not None
        for a, b in zip(together.sampling_logprobs[rows], single.sampling_logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    other = HFEngine(llama, PAD, EOS).generate(ps[:1], cfg, [12])
    assert other.completion_ids != alone[0].completion_ids
    with pytest.raises(ValueError, match="2 seeds for 4 prompts"):
        HFEngine(llama, PAD, EOS).generate(ps, cfg, [1, 2])


def test_row_sampler_samples_the_tempered_filtered_softmax(llama: nn.Module) -> None:
    # The first token of many seeded rows against softmax(top_k(z / T)) computed directly from the logits.
    prompt, temperature, top_k, n = prompts(1)[0], 1.3, 8, 3000
    with torch.no_grad():
        logits = llama(input_ids=torch.tensor([prompt])).logits[0, -1].float()  # (V,)
    scaled = logits / temperature  # (V,)
    kept = scaled >= scaled.topk(top_k).values[-1]  # (V,)
    probs = torch.softmax(torch.where(kept, scaled, torch.tensor(float("-inf"))), dim=-1)  # (V,)
    cfg = SamplingConfig(n=n, temperature=temperature, top_k=top_k, max_tokens=1, seed=5)
    out = HFEngine(llama, PAD, EOS, chunk_size=1024).generate([prompt], cfg)
    counts = torch.bincount(torch.tensor([ids[0] for ids in out.completion_ids]), minlength=HF_ENGINE_VOCAB).double()
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(kept).flatten().tolist())
    total_variation = 0.5 * float((counts / n - probs.double()).abs().sum())
    assert total_variation < 0.05  # ~0.02 expected from 3000 draws over 8 tokens
    # the reported log-prob is the policy's (tempered, unfiltered), not the sampler's
    assert out.sampling_logprobs is not None
    first = out.completion_ids[0][0]
    assert out.sampling_logprobs[0][0] == pytest.approx(float(torch.log_softmax(scaled, -1)[first]), abs=1e-5)
