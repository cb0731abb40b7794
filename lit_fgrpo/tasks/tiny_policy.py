"""Tiny decoder-only policies trained from scratch (Qwen2 or Llama architecture), built offline from a config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, PreTrainedModel, Qwen2Config


@dataclass
class TinyPolicyConfig:
    """Architecture of a tiny causal language model.

    The defaults (about 0.79M parameters with the 17-word maze vocabulary) suit 4x4 mazes on a 2-core CPU.
    """

    arch: Literal["qwen2", "llama"] = "llama"
    """Model family. ``"llama"`` is the default because transformers 5 rebuilds the tokenizer of a folder whose
    ``config.json`` says ``qwen2`` as a ``Qwen2Tokenizer`` (byte-level pre-tokenizer), which silently changes the ids
    of a word-level vocabulary; a Llama folder keeps ``tokenizer.json`` as written. The two differ only in Qwen2's
    q/k/v biases."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 3
    """Number of decoder layers."""
    num_heads: int = 4
    """Number of attention (query) heads."""
    num_kv_heads: int = 4
    """Number of key/value heads (grouped-query attention when below ``num_heads``)."""
    intermediate_size: int = 512
    """Width of the SwiGLU feed-forward layer."""
    max_position_embeddings: int = 256
    """Longest prompt + completion the model is meant for."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output head."""
    initializer_range: float = 0.02
    """Std of the normal init; about 0.15 makes random models whose outputs differ (for tests that compare)."""

    @classmethod
    def paper_17x17(cls, arch: Literal["qwen2", "llama"] = "qwen2") -> TinyPolicyConfig:
        """The paper's maze policy (MaxRL): 4 layers, width 256, FFN 1024, 4 heads, 2 KV heads, RoPE theta 1e6.

        About 3.9M parameters with the 17-word maze vocabulary. The paper used Qwen2 (and bf16; this is fp32).
        With ``arch="qwen2"`` save the tokenizer in a folder of its own (see ``arch``).
        """
        return cls(
            arch=arch,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=1024,
            max_position_embeddings=512,
            rope_theta=1e6,
            tie_word_embeddings=True,
        )


def _hf_config(vocab_size: int, config: TinyPolicyConfig, pad_id: int, bos_id: int, eos_id: int) -> PretrainedConfig:
    """Translate to a transformers config; RoPE theta goes where the installed version reads it."""
    cls = Qwen2Config if config.arch == "qwen2" else LlamaConfig
    hf = cls(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    rope = getattr(hf, "rope_parameters", None)
    if isinstance(rope, dict):  # transformers 5 keeps theta here
        rope["rope_theta"] = config.rope_theta
    else:
        hf.rope_theta = config.rope_theta
    return hf


def build_tiny_policy(
    vocab_size: int,
    config: TinyPolicyConfig | None = None,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
) -> PreTrainedModel:
    """Build a randomly initialised fp32 causal LM from ``config``.

    Args:
        vocab_size: Number of token ids (e.g. ``len(MAZE_VOCAB)``).
        config: Architecture; defaults to ``TinyPolicyConfig()``.
        pad_token_id: Padding id, also written to the generation config.
        bos_token_id: Beginning-of-sequence id.
        eos_token_id: End-of-sequence id.

    Returns:
        The model in eval mode, on CPU, in float32.
    """
    config = config or TinyPolicyConfig()
    if config.hidden_size % config.num_heads or config.num_heads % config.num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    hf_config = _hf_config(vocab_size, config, pad_token_id, bos_token_id, eos_token_id)
    model = AutoModelForCausalLM.from_config(hf_config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = bos_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model.to(torch.float32).eval()
