"""Tiny random causal LMs and a word-level tokenizer for the tests: one builder, and the shapes tests share.

Every shape here is a few layers of a real transformers architecture with random weights, built offline in well under
a second. The FGRPOModule's own tiny policy (built by the package from a ``model_config``) is
``tests/training/tiny_setup.py``'s ``TINY_MODEL``; the chat-templated tokenizer of the multi-turn tests is
``tests/environments/tiny_chat.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

PAD, EOS, BOS = 0, 1, 2
"""Special token ids of every tiny model here (and of the word-level tokenizer)."""

HF_ENGINE_VOCAB = 64
"""Vocabulary of :func:`hf_engine_model`."""

VLLM_VOCAB = 96
"""Vocabulary of :func:`vllm_model` and :func:`vllm_tokenizer`."""

QWEN_VOCAB = 151_936
"""Qwen2's real vocabulary size: :func:`tiny_lm`'s default, so that the output layer is as wide as a real model's."""


def tiny_causal_lm(model_type: str, seed: int = 0, **config: Any) -> nn.Module:
    """A random float32 ``AutoModelForCausalLM`` of ``model_type`` ("llama", "qwen2", ...) with ``config`` as its
    settings, its weights drawn after ``torch.manual_seed(seed)``; in train mode, as transformers builds it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_config = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)


def hf_engine_model(kind: str = "llama", seed: int = 0) -> nn.Module:
    """The HF engine tests' 2-layer model (4 heads, 2 KV heads); ``initializer_range=0.15`` so outputs depend on the
    weights. ``kind`` is "llama" or "qwen2"."""
    return tiny_causal_lm(
        "llama" if kind == "llama" else "qwen2",
        seed=seed,
        vocab_size=HF_ENGINE_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


def vllm_model(kind: str = "llama", tied: bool = True) -> nn.Module:
    """The vLLM and server tests' 2-layer model: head_dim 32 (vLLM's CPU attention rejects 16),
    ``initializer_range=0.15``. ``kind`` is "llama" or "qwen2"."""
    return tiny_causal_lm(
        "llama" if kind == "llama" else "qwen2",
        vocab_size=VLLM_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        initializer_range=0.15,
        tie_word_embeddings=tied,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


def vllm_tokenizer() -> Any:
    """A word-level tokenizer for :func:`vllm_model`: ``<pad>``, ``</s>``, ``<s>`` and ``t3`` ... ``t95``."""
    return word_level_tokenizer(VLLM_VOCAB)


def word_level_tokenizer(vocab_size: int) -> Any:
    """A whitespace word-level ``PreTrainedTokenizerFast``: :data:`PAD` ``<pad>``, :data:`EOS` ``</s>``, :data:`BOS`
    ``<s>``, and ``t<i>`` for every other id below ``vocab_size``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<s>": BOS, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>")


def tiny_lm(vocab: int = QWEN_VOCAB, tied: bool = True, model_type: str = "qwen2", **extra: Any) -> nn.Module:
    """The log-prob tests' 2-layer model (hidden 32) in eval mode; ``initializer_range=0.5`` gives peaked
    distributions, entropies far from log V. ``extra`` adds config settings (``head_dim``, softcapping)."""
    return tiny_causal_lm(
        model_type,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        initializer_range=0.5,
        **extra,
    ).eval()
