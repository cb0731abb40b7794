"""Chunked log-probs through the output layer equal the plain full-logits computation, at a real vocabulary.

Reference: the model's own forward with full (B, T, V) logits (``chunked=False``), in value and in gradient.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lit_fgrpo.models.logprobs import completion_logprobs, split_output_layer
from tests.tiny_models import QWEN_VOCAB, tiny_lm


def batch(B: int = 4, Tp: int = 6, T: int = 9, vocab: int = QWEN_VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts and right-padded completions, (B, Tp + T) each."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (B, Tp + T), generator=g)  # (B, L)
    mask = torch.ones(B, Tp + T, dtype=torch.long)  # (B, L)
    for row in range(B):
        mask[row, : row % 3] = 0  # left padding of the prompt
        mask[row, Tp + T - row % 4 :] = 0  # right padding of the completion
    return ids, mask


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Each gradient within 1e-5 of its largest entry (float32 sums in another order; small vocabularies only)."""
    for name, ref in want.items():
        scale = float(ref.abs().max())
        torch.testing.assert_close(
            got[name], ref, rtol=0, atol=1e-5 * max(scale, 1e-3), msg=lambda m, name=name: f"{name}: {m}"
        )


def relative_errors(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter: the largest |grad - exact| over the largest |exact| entry."""
    return {
        name: float((grads[name].double() - ref).abs().max()) / max(float(ref.abs().max()), 1e-12)
        for name, ref in exact.items()
    }


def float64_grads(tied: bool, temperature: float = 0.7) -> dict[str, torch.Tensor]:
    """The plain path's gradients in float64: the exact values both float32 paths approximate."""
    model = tiny_lm(tied=tied).double()
    ids, mask = batch()
    T = 9
    weights = torch.linspace(-1.0, 2.0, ids.shape[0] * T, dtype=torch.float64).view(-1, T)  # (B, T)
    out = completion_logprobs(model, ids, mask, T, temperature=temperature, chunked=False)
    (out.logp * weights).sum().backward()
    return grads(model)


def both_paths(model: nn.Module, vocab: int = QWEN_VOCAB, T: int = 9, temperature: float = 0.7) -> list[Any]:
    """(logp, entropy, grads) on the plain path, then on the chunked one; loss = sum of weighted log-probs."""
    ids, mask = batch(T=T, vocab=vocab)
    weights = torch.linspace(-1.0, 2.0, ids.shape[0] * T).view(-1, T)  # (B, T)
    results = []
    for chunked in (False, True):
        model.zero_grad(set_to_none=True)
        out = completion_logprobs(
            model,
            ids,
            mask,
            T,
            temperature=temperature,
            chunk_rows=3,
            with_entropy=True,
            chunk_tokens=5,
            chunked=chunked,
        )
        (out.logp * weights).sum().backward()
        results.append((out.logp.detach(), out.entropy, grads(model)))
    return results


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_equals_plain_in_value_entropy_and_gradient(tied: bool) -> None:
    model = tiny_lm(tied=tied)
    assert split_output_layer(model) is not None
    (lp, ent, g), (lp_c, ent_c, g_c) = both_paths(model)
    torch.testing.assert_close(lp_c, lp, rtol=1e-5, atol=1e-5)
    assert ent is not None and ent_c is not None and not ent_c.requires_grad
    torch.testing.assert_close(ent_c, ent, rtol=1e-5, atol=1e-5)
    assert 0.1 < float(ent.mean()) < 0.9 * torch.log(torch.tensor(float(QWEN_VOCAB)))  # not a uniform distribution
    assert g.keys() == g_c.keys() and len(g) > 0
    # At a 151,936-token vocabulary a float32 gradient entry sums 36 positions x 151,936 softmax terms, and each
    # kernel (AVX-512, AVX2, the default one) rounds those sums in its own order: on some CPUs the two float32
    # paths differ by 1e-5 to 6e-5 of a tensor's largest entry, beyond any fixed bound set on one machine. So
    # both are held to the exact (float64) gradient, and the chunked path may not be more than 4x worse than the
    # worst error of the model's own float32 forward, measured here in the same process on the same kernels.
    # Measured (AMD EPYC, AVX-512 and ATEN_CPU_CAPABILITY=default): plain path worst 7e-6 to 1.2e-5, chunked up
    # to 1.4e-5 of the largest entry (bound 3e-5 to 5e-5); a second AMD EPYC (family 25 model 1): plain 5.6e-6,
    # chunked 2.5e-5, so "4x plain" alone failed there. Hence a floor of 1e-4 (about 840 float32 ulps of the
    # largest entry): the chunked head's logit gradient scaled by 1.001 (values unchanged) fails at 7.1e-4, 7x it.
    exact = float64_grads(tied)
    plain_error = max(relative_errors(g, exact).values())
    assert plain_error < 1e-3, f"the float32 forward itself is {plain_error:.2e} from float64: check the reference"
    bound = max(4 * plain_error, 1e-4)
    chunked_error = relative_errors(g_c, exact)
    worst = max(chunked_error, key=chunked_error.__getitem__)
    assert chunked_error[worst] <= bound, (
        f"{worst}: chunked gradient {chunked_error[worst]:.2e} of its largest entry from float64, "
        f"bound {bound:.2e} (4x the plain path's {plain_error:.2e}, at least 1e-4)"
    )


def test_entropy_matches_its_definition_and_is_only_computed_when_asked() -> None:
    model = tiny_lm(vocab=50)
    ids, mask = batch(vocab=50)
    with torch.no_grad():
        out = completion_logprobs(model, ids, mask, 9, temperature=1.3, with_entropy=True, chunk_tokens=4)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    logp = torch.log_softmax(logits[:, -10:-1] / 1.3, dim=-1)  # (B, T, V)
    real = mask[:, -9:].float()  # (B, T): padding positions are 0 by contract
    want = logp.gather(-1, ids[:, -9:, None]).squeeze(-1) * real
    torch.testing.assert_close(out.logp, want, rtol=1e-5, atol=1e-5)
    assert out.entropy is not None
    torch.testing.assert_close(out.entropy, -(logp.exp() * logp).sum(-1) * real, rtol=1e-5, atol=1e-5)
    assert completion_logprobs(model, ids, mask, 9).entropy is None


class LargestLogits(TorchDispatchMode):
    """Records the largest vocabulary-sized tensor (last dim V) any op produces, in forward and backward."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


def test_chunked_path_never_materialises_batch_by_vocabulary_logits() -> None:
    model = tiny_lm(tied=False)
    T, chunk = 32, 40  # chunk > hidden size 32, so the (H, V) transposed weight is not the largest
    ids, mask = batch(T=T)
    B = ids.shape[0]
    sizes = {}
    for chunked in (False, True):
        with LargestLogits(QWEN_VOCAB) as probe:
            out = completion_logprobs(
                model, ids, mask, T, chunk_rows=B, with_entropy=True, chunk_tokens=chunk, chunked=chunked
            )
            out.logp.sum().backward()
        sizes[chunked] = probe.largest
    assert sizes[False] >= B * T * QWEN_VOCAB  # the plain path does build (B, T, V) logits
    assert sizes[True] == chunk * QWEN_VOCAB  # one (chunk, V) block at a time, in forward and backward


def test_lora_wrapped_model_and_disabled_adapters() -> None:
    from peft import LoraConfig, get_peft_model

    base = tiny_lm(vocab=1000, tied=False)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    model = get_peft_model(base, config)
    assert split_output_layer(model) is not None
    (lp, ent, g), (lp_c, ent_c, g_c) = both_paths(model, vocab=1000)
    torch.testing.assert_close(lp_c, lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_c, ent, rtol=1e-5, atol=1e-5)
    assert any("lora" in name for name in g) and g.keys() == g_c.keys()
    assert_grads_close(g_c, g)
    ids, mask = batch(vocab=1000)
    with torch.no_grad(), model.disable_adapter():
        off = completion_logprobs(model, ids, mask, 9, chunk_tokens=5, chunked=True).logp
        plain_off = completion_logprobs(model, ids, mask, 9, chunked=False).logp
    torch.testing.assert_close(off, plain_off, rtol=1e-5, atol=1e-5)
    assert (off - lp).abs().max() > 1e-3  # the adapters do change the log-probs


def test_models_that_cannot_be_split_take_the_plain_path() -> None:
    softcapped = tiny_lm(vocab=64, model_type="gemma2", head_dim=16, final_logit_softcapping=30.0)
    assert split_output_layer(softcapped) is None

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs: Any) -> Any:
            return self.inner(**kwargs)

    qwen = tiny_lm(vocab=64)
    wrapped = Wrapper(qwen)
    assert split_output_layer(wrapped) is None
    ids, mask = batch(vocab=64)
    with torch.no_grad():
        torch.testing.assert_close(
            completion_logprobs(wrapped, ids, mask, 9).logp, completion_logprobs(qwen, ids, mask, 9).logp
        )
        with pytest.raises(ValueError, match="chunked=True"):
            completion_logprobs(wrapped, ids, mask, 9, chunked=True)


def test_logits_kept_for_backward_and_recomputed_there_give_the_same_gradient() -> None:
    # 4 rows x 30 positions x V = 151,936: over the 64 MiB of logits autograd keeps, so backward recomputes the head
    # chunk by chunk; one row at a time (4.6M logits) stays under it and keeps them
    model = tiny_lm(tied=True)
    T = 30
    ids, mask = batch(T=T)
    assert ids.shape[0] * T * QWEN_VOCAB > 1 << 24 > T * QWEN_VOCAB
    results = []
    for chunk_rows in (ids.shape[0], 1):
        model.zero_grad(set_to_none=True)
        out = completion_logprobs(model, ids, mask, T, chunk_rows=chunk_rows, chunk_tokens=40, chunked=True)
        out.logp.sum().backward()
        results.append((out.logp.detach(), grads(model)))
    (recomputed, g_re), (kept, g_kept) = results
    torch.testing.assert_close(recomputed, kept, rtol=1e-6, atol=1e-6)
    for name in g_kept:
        scale = float(g_kept[name].abs().max())
        torch.testing.assert_close(g_re[name], g_kept[name], rtol=0, atol=1e-5 * scale + 1e-12)
