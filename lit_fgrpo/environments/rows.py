"""Training rows of episodes packed into the padded tensors the training step reads.

The same layout as :func:`lit_fgrpo.engines.base.pad_rollouts` builds for single-turn rollouts: each row's prompt is
right-aligned to one width so every completion starts at the same column, completions are right-padded. Two things
differ: every row carries its own prompt (a ``reset`` observation may change it), and the completion mask is the
row's loss mask, 0 on environment and tool tokens that the attention mask still covers (the model reads them; the
loss and the KL do not).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lit_fgrpo.environments.episode import TrainingRow


def pad_training_rows(rows: Sequence[TrainingRow], pad_token_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Pack B training rows.

    Args:
        rows: The episodes' rows (:func:`~lit_fgrpo.environments.episode.training_row`), prompt-major as the
            collector orders them.
        pad_token_id: Filler id (its positions are masked).

    Returns:
        ``input_ids`` (B, Tp + T), ``attention_mask`` (B, Tp + T) 1 on every real token (environment tokens
        included), ``completion_mask`` (B, T) float, the rows' loss masks, and ``sampling_logp`` (B, T) or ``None``
        when a row has no log-probs.
    """
    if not rows:
        raise ValueError("pad_training_rows needs at least one row")
    B = len(rows)
    prompt_width = max(len(r.prompt_ids) for r in rows)
    width = max(1, max(len(r.completion_ids) for r in rows))
    input_ids = torch.full((B, prompt_width + width), pad_token_id, dtype=torch.long)  # (B, Tp + T)
    attention_mask = torch.zeros_like(input_ids)  # (B, Tp + T)
    completion_mask = torch.zeros((B, width), dtype=torch.float32)  # (B, T)
    has_logp = all(r.sampling_logprobs is not None for r in rows)
    sampling_logp = torch.zeros((B, width), dtype=torch.float32) if has_logp else None  # (B, T)
    for b, row in enumerate(rows):
        first = prompt_width - len(row.prompt_ids)
        input_ids[b, first:prompt_width] = torch.tensor(row.prompt_ids, dtype=torch.long)
        attention_mask[b, first:prompt_width] = 1
        n = len(row.completion_ids)
        if n:
            input_ids[b, prompt_width : prompt_width + n] = torch.tensor(row.completion_ids, dtype=torch.long)
            attention_mask[b, prompt_width : prompt_width + n] = 1
            completion_mask[b, :n] = torch.tensor(row.loss_mask, dtype=torch.float32)
            if sampling_logp is not None and row.sampling_logprobs is not None:
                sampling_logp[b, :n] = torch.tensor(row.sampling_logprobs, dtype=torch.float32)
    return input_ids, attention_mask, completion_mask, sampling_logp
