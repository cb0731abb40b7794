"""Teacher-forced log-probs of given completions under a policy, for the weight-sync check of every engine.

One scorer serves the HF engine's ``score``, the vLLM engine's ``verify_sync`` and the rollout callback's
check after each weight push, so all three compare against the trainer's own log-prob path
(:func:`lit_fgrpo.models.logprobs.completion_logprobs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from lit_fgrpo.engines.base import Generation
from lit_fgrpo.engines.padding import pad_rollouts
from lit_fgrpo.models.logprobs import completion_logprobs


@contextmanager
def module_mode(model: nn.Module, training: bool) -> Iterator[None]:
    """Put ``model`` in train (``training=True``) or eval mode and restore its previous flag afterwards.

    The policy trains in train mode (gradient checkpointing and dropout apply only there) and samples, scores
    and computes its frozen old/reference log-probs in eval mode.
    """
    was_training = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was_training)


def eval_mode(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Put ``model`` in eval mode and restore its previous training flag afterwards."""
    return module_mode(model, False)


def train_mode(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Put ``model`` in train mode and restore its previous training flag afterwards."""
    return module_mode(model, True)


@torch.no_grad()
def policy_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[list[int]],
    completion_ids: Sequence[list[int]],
    pad_token_id: int = 0,
    temperature: float = 1.0,
    chunk_rows: int = 64,
) -> list[Tensor]:
    """``log_softmax(z / temperature)`` of each completion token given its prompt, in eval mode.

    Returns:
        One float32 CPU tensor of shape (T_i,) per row (empty for an empty completion).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if not prompt_ids:
        return []
    device = next(model.parameters()).device
    generation = Generation(completion_ids=[list(c) for c in completion_ids], finished=[True] * len(completion_ids))
    ids, attn, mask, _ = pad_rollouts(list(prompt_ids), generation, 1, pad_token_id)  # (B, L), (B, L), (B, T)
    with eval_mode(model):
        logp = completion_logprobs(
            model, ids.to(device), attn.to(device), mask.shape[1], temperature=temperature, chunk_rows=chunk_rows
        ).logp.cpu()  # (B, T)
    return [logp[row, : len(c)].clone() for row, c in enumerate(completion_ids)]
