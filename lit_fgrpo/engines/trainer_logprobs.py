"""Teacher-forced log-probs of given completions under a policy, for the weight-sync check of every engine.

One scorer serves the HF engine's ``score``, the vLLM engine's ``verify_sync`` and the rollout callback's
check after each weight push, so all three compare against the trainer's own log-prob path
(:func:`lit_fgrpo.models.logprobs.completion_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lit_fgrpo.engines.base import Generation, pad_rollouts
from lit_fgrpo.models.logprobs import completion_logprobs, eval_mode


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
