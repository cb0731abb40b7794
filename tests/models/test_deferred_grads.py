"""Deferred weight gradients: one product per weight over the prompt-shared pass's decoder calls, the same gradient.

References: the per-call products of ordinary autograd (``defer_weight_grads=False``), the whole-row pass and the
float64 model (``assert_as_exact_as_whole_rows``); under DDP and FSDP2: tests/distributed/test_process_group.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lit_fgrpo.models.deferred_grads import MIN_SIDE, deferrable_layers, deferred_weight_grads
from lit_fgrpo.models.logprobs import completion_logprobs, split_output_layer
from tests.models.test_prompt_sharing import assert_as_exact_as_whole_rows, decoder_rows, group_batch, run
from tests.tiny_models import tiny_causal_lm

WIDE = {"hidden_size": MIN_SIDE, "intermediate_size": 2 * MIN_SIDE, "num_attention_heads": 4, "num_key_value_heads": 4}
"""Every projection at least :data:`MIN_SIDE` wide, so that every decoder weight is deferred."""


def wide_lm(model_type: str = "qwen2", tied: bool = True) -> nn.Module:
    return tiny_causal_lm(
        model_type, vocab_size=1000, num_hidden_layers=2, tie_word_embeddings=tied, initializer_range=0.1, **WIDE
    ).train()


def decoder_of(model: nn.Module) -> nn.Module:
    split = split_output_layer(model)
    assert split is not None
    return split[0]


def graph_names(output: torch.Tensor) -> set[str]:
    """Names of every backward node behind ``output``."""
    seen: set[Any] = set()
    todo = [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return {node.name() for node in seen}


@pytest.mark.parametrize(("model_type", "tied"), [("qwen2", True), ("llama", False)])
def test_deferred_gradients_equal_the_per_call_ones(model_type: str, tied: bool) -> None:
    model = wide_lm(model_type, tied)
    assert len(deferrable_layers(decoder_of(model))) == 14  # q k v o gate up down x 2 layers (qwen2: with biases)
    ids, mask = group_batch()
    calls = decoder_rows(model)
    out = completion_logprobs(model, ids, mask, 6)
    assert any("CollectGradients" in name for name in graph_names(out.logp))  # the deferred path ran
    assert len(calls) >= 3  # the prompts, then at least two length groups: several products per weight to defer
    lp, _, deferred = run(model, ids, mask, 6)
    lp_c, _, per_call = run(model, ids, mask, 6, defer_weight_grads=False)
    lp_w, _, whole = run(model, ids, mask, 6, share_prompts=False)
    torch.testing.assert_close(lp, lp_c, rtol=0, atol=0)  # the forward is the same computation
    torch.testing.assert_close(lp, lp_w, rtol=1e-5, atol=1e-5)
    assert deferred.keys() == per_call.keys()
    for name, grad in deferred.items():
        err = float((grad - per_call[name]).abs().max() / per_call[name].abs().max())
        assert err < 1e-5, f"{name}: {err:.1e} of its largest entry from the per-call gradient"
    assert_as_exact_as_whole_rows(model, ids, mask, deferred, whole)


def test_gradients_accumulate_over_two_passes() -> None:
    """A second micro-batch adds to the first one's gradient (the deferred gradient reaches autograd's leaves)."""
    model = wide_lm()
    ids, mask = group_batch()
    grads = {}
    for defer in (True, False):
        model.zero_grad(set_to_none=True)
        for rows in (slice(0, 6), slice(6, 12)):
            completion_logprobs(model, ids[rows], mask[rows], 6, defer_weight_grads=defer).logp.sum().backward()
        grads[defer] = {name: p.grad.clone() for name, p in model.named_parameters()}
    for name, grad in grads[True].items():
        torch.testing.assert_close(grad, grads[False][name], rtol=1e-4, atol=1e-6)


def test_what_is_not_deferred() -> None:
    from peft import LoraConfig, get_peft_model

    model = wide_lm()
    decoder = decoder_of(model)
    with torch.no_grad():
        assert deferrable_layers(decoder) == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert deferrable_layers(decoder) == []
    assert deferrable_layers(decoder, min_side=MIN_SIDE + 1) == []
    lora = get_peft_model(wide_lm(), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    assert deferrable_layers(decoder_of(lora)) == []  # the adapters are thin, the base is frozen


def test_the_layers_get_their_own_forward_back() -> None:
    model = wide_lm()
    decoder = decoder_of(model)
    layers = deferrable_layers(decoder)
    with pytest.raises(RuntimeError, match="inside"), deferred_weight_grads(decoder) as collect:
        assert all("forward" in vars(layer) for layer in layers)
        collect(torch.zeros(1, MIN_SIDE, requires_grad=True))
        raise RuntimeError("inside")
    assert not any("forward" in vars(layer) for layer in layers)
    with deferred_weight_grads(decoder, enabled=False) as collect:
        x = torch.ones(2)
        assert collect(x) is x and not any("forward" in vars(layer) for layer in layers)
