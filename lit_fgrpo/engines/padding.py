"""Prompts and an engine's completions packed into the padded tensors the trainer and the scorers read.

Rows are prompt-major (completion ``j`` of prompt ``i`` is row ``i * G + j``); prompts are right-aligned to one width
so every completion starts at the same column.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_fgrpo.engines.base import Generation


def pad_rollouts(
    prompt_ids: list[list[int]],
    generation: Generation,
    group_size: int,
    pad_token_id: int,
    mask_truncated: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Pack prompts and their completions into padded tensors.

    Args:
        prompt_ids: P prompts as token lists.
        generation: the engine's output, B = P * group_size rows, prompt-major.
        group_size: G.
        pad_token_id: filler id (its positions are masked, so its value never matters).
        mask_truncated: zero the loss mask of completions cut at max_tokens (DAPO's overlong filtering).

    Returns:
        ``input_ids`` (B, Tp + T), ``attention_mask`` (B, Tp + T), ``completion_mask`` (B, T) and
        ``sampling_logp`` (B, T) or None.
    """
    rows = len(generation.completion_ids)
    if rows != len(prompt_ids) * group_size:
        raise ValueError(f"engine returned {rows} rows for {len(prompt_ids)} prompts x {group_size} samples")
    prompt_width = max(len(p) for p in prompt_ids)
    comp_width = max(1, max((len(c) for c in generation.completion_ids), default=1))
    input_ids = torch.full((rows, prompt_width + comp_width), pad_token_id, dtype=torch.long)  # (B, Tp + T)
    attention_mask = torch.zeros_like(input_ids)  # (B, Tp + T)
    completion_mask = torch.zeros((rows, comp_width), dtype=torch.float32)  # (B, T)
    has_logp = generation.sampling_logprobs is not None
    sampling_logp = torch.zeros((rows, comp_width), dtype=torch.float32) if has_logp else None  # (B, T)
    for row, completion in enumerate(generation.completion_ids):
        prompt = prompt_ids[row // group_size]
        input_ids[row, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, prompt_width - len(prompt) : prompt_width] = 1
        n = len(completion)
        if n:
            input_ids[row, prompt_width : prompt_width + n] = torch.tensor(completion, dtype=torch.long)
            attention_mask[row, prompt_width : prompt_width + n] = 1
            truncated = bool(generation.finished) and not generation.finished[row]
            completion_mask[row, :n] = 0.0 if (mask_truncated and truncated) else 1.0
            if sampling_logp is not None and generation.sampling_logprobs is not None:
                sampling_logp[row, :n] = torch.tensor(generation.sampling_logprobs[row][:n], dtype=torch.float32)
    return input_ids, attention_mask, completion_mask, sampling_logp
