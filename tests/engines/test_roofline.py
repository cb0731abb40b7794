"""The decode roof: a token's FLOPs from the model's own parameters, and a measured matmul rate."""

from __future__ import annotations

from lit_fgrpo.engines.roofline import decode_shapes, matmul_peak, measure_roof
from tests.tiny_models import hf_engine_model, tiny_causal_lm


def test_a_tokens_flops_are_twice_the_weights_it_goes_through() -> None:
    model = hf_engine_model()  # untied: embedding and output layer are separate 64 x 64 matrices
    shapes = decode_shapes(model)
    total = sum(p.numel() for p in model.parameters())
    assert shapes.layer_params == total - 2 * 64 * 64
    assert shapes.flops_per_token == 2 * (total - 64 * 64)
    tied = tiny_causal_lm("llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    assert decode_shapes(tied).flops_per_token == 2 * sum(p.numel() for p in tied.parameters())  # head = embedding
    per_layer = sum(n_in * n_out for n_in, n_out in shapes.layer_matmuls)
    assert shapes.layer_params == 2 * per_layer + 2 * 2 * 64 + 64  # + the layers' two norms and the final norm


def test_the_roof_is_the_measured_rate_over_a_tokens_cost() -> None:
    model = hf_engine_model()
    assert matmul_peak(decode_shapes(model), rows=16, budget=0.01) > 0
    roof = measure_roof(model, rows=16, budget=0.01)
    assert roof.tokens_per_second == roof.gflops / roof.gflop_per_token
    assert roof.share(roof.tokens_per_second / 2) == 0.5
