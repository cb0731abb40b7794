"""Shared pieces of the conversation warm-start tests: a tiny chat policy long enough for tool prompts, transcripts."""

from __future__ import annotations

from typing import Any

import torch

from lit_fgrpo.environments import ChatTurns, load_environment
from lit_fgrpo.environments.calculator_transcripts import multiplication_transcripts
from lit_fgrpo.environments.transcripts import TranscriptTokens, render_transcript
from tests.environments.tiny_chat import chat_tokenizer
from tests.tiny_models import tiny_causal_lm

CHAT_POLICY: dict[str, Any] = {
    "vocab_size": 420,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,  # the calculator's tool instructions take ~700 tokens of this tokenizer
    "tie_word_embeddings": True,
    "initializer_range": 0.15,
}


def chat_policy(seed: int = 0) -> torch.nn.Module:
    """A random 2-layer Llama over :func:`chat_tokenizer`'s vocabulary with room for tool prompts."""
    return tiny_causal_lm("llama", seed=seed, **(CHAT_POLICY | {"vocab_size": len(chat_tokenizer())}))


def calculator_turns() -> ChatTurns:
    return ChatTurns(chat_tokenizer(), tools=load_environment("calculator").tool_schemas())


def transcripts(count: int, seed: int = 0) -> list[TranscriptTokens]:
    """``count`` calculator transcripts as token rows (products of 2-3 digit numbers)."""
    turns = calculator_turns()
    return [render_transcript(turns, row["messages"]) for row in multiplication_transcripts(count, seed=seed)]


def pad_id() -> int:
    return int(chat_tokenizer().pad_token_id)
