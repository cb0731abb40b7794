"""The trainer's side of the weight-sync check: teacher-forced log-probs of given completions under the policy.

:func:`check_policy_sync` is the one weight-sync check: the engine's log-probs of a few probe rows
(:meth:`~lit_fgrpo.engines.base.RolloutEngine.check_sync`, which each engine runs on every copy of its weights)
against the policy's, both at temperature 1, with one tolerance rule
(:func:`~lit_fgrpo.engines.sync_check.default_sync_tolerance`). The rollout's engine sync runs it after each push;
tests and benchmarks run the same function. :func:`policy_logprobs` is the trainer's own log-prob path
(:func:`lit_fgrpo.models.logprobs.completion_logprobs`); the HF engine's ``score`` uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lit_fgrpo.engines.base import Generation, RolloutEngine, pad_rollouts
from lit_fgrpo.engines.sync_check import default_sync_tolerance
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


def check_policy_sync(
    engine: RolloutEngine,
    policy: nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    tolerance: float | None,
    where: str,
    pad_token_id: int = 0,
) -> float:
    """The weight-sync check: the engine's log-probs of the probe rows against the policy's, both at temperature 1.

    Args:
        engine: the engine the policy's weights were pushed into.
        policy: the trainer's policy.
        prompt_ids: the probe's prompts.
        completion_ids: the probe's completions, teacher-forced on both sides.
        tolerance: largest allowed gap; None: by the policy's parameter dtype
            (:func:`~lit_fgrpo.engines.sync_check.default_sync_tolerance`).
        where: who checks, for the error message.
        pad_token_id: pads the trainer's batch of probe rows.

    Returns:
        ``max |logp_engine - logp_trainer|`` over the probe's completion tokens (over every copy of the weights).

    Raises:
        WeightSyncError: beyond ``tolerance`` (stale or partially loaded weights).
    """
    trainer_logp = policy_logprobs(policy, prompt_ids, completion_ids, pad_token_id, temperature=1.0)
    if tolerance is None:
        tolerance = default_sync_tolerance(next(policy.parameters()).dtype)
    return engine.check_sync(prompt_ids, completion_ids, trainer_logp, tolerance, where)
