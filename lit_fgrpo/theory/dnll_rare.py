"""ΔNLL_rare (paper Appendix M.2): how far training moves away from base-model-rare correct solutions.

Protocol: sample many base-model rollouts per training prompt, keep the correct ones, score each by its
length-normalised NLL under the base model, take the top ``top_fraction`` (1% in the paper, 1,263 trajectories)
as the "rare" correct solutions, and report the mean increase of their NLL under the trained model. Lower is
better: a large positive value means the trained policy has moved mass away from rare-but-correct solutions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def rare_indices(base_nll: Tensor, top_fraction: float = 0.01) -> Tensor:
    """Indices of the ``k = max(1, ceil(top_fraction * M))`` trajectories with the highest base NLL.

    Args:
        base_nll: (M,) length-normalised NLL under the base model.
        top_fraction: Fraction in (0, 1] to keep.

    Returns:
        (k,) indices, highest NLL first.
    """
    if not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if base_nll.ndim != 1 or base_nll.numel() == 0:
        raise ValueError(f"base_nll must be a non-empty 1-D tensor, got shape {tuple(base_nll.shape)}")
    k = min(base_nll.numel(), max(1, math.ceil(top_fraction * base_nll.numel())))
    return torch.topk(base_nll, k).indices  # (k,)


def delta_nll_rare(
    base_nll: Tensor, trained_nll: Tensor, top_fraction: float = 0.01, correct: Tensor | None = None
) -> float:
    """Mean NLL increase of the base-model-rarest correct trajectories.

    ``R = top-k_{i in correct} base_nll_i`` with ``k = max(1, ceil(top_fraction * |correct|))``;
    ``ΔNLL_rare = (1/k) sum_{i in R} (trained_nll_i - base_nll_i)``.

    Args:
        base_nll: (M,) length-normalised NLL of each trajectory under the base model.
        trained_nll: (M,) the same trajectories under the trained model.
        top_fraction: Fraction of the (correct) trajectories counted as rare (paper: 0.01).
        correct: Optional (M,) bool mask; when given only these trajectories are ranked (otherwise all rows are
            assumed correct).

    Returns:
        ΔNLL_rare as a Python float.
    """
    if base_nll.shape != trained_nll.shape:
        raise ValueError(f"shape mismatch: base {tuple(base_nll.shape)} vs trained {tuple(trained_nll.shape)}")
    if correct is not None:
        base_nll, trained_nll = base_nll[correct.bool()], trained_nll[correct.bool()]  # (M',)
    idx = rare_indices(base_nll.double(), top_fraction)  # (k,)
    return float((trained_nll.double()[idx] - base_nll.double()[idx]).mean())


def completion_nll(logits: Tensor, input_ids: Tensor, completion_mask: Tensor) -> Tensor:
    """Length-normalised NLL of the completion tokens given full-sequence logits.

    Token ``t`` is predicted by ``logits[:, t-1]``:
    ``nll_b = -sum_{t>=1} m_{b,t} log softmax(logits_{b,t-1})[x_{b,t}] / max(1, sum_{t>=1} m_{b,t})``.

    Args:
        logits: (B, T, V) model logits.
        input_ids: (B, T) token ids.
        completion_mask: (B, T) 1 on completion tokens (position 0 is ignored: it has no prediction).

    Returns:
        (B,) float32 NLL per row (0 for a row without completion tokens).
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    token_logp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    mask = completion_mask[:, 1:].to(token_logp.dtype)  # (B, T-1)
    return -(token_logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)


@torch.no_grad()
def sequence_nll(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, batch_size: int = 8
) -> Tensor:
    """Length-normalised NLL of each completion under a Hugging Face causal LM (no grad, chunked over rows).

    ``nll_b = -(1/|c_b|) sum_{t in c_b} log pi(x_{b,t} | x_{b,<t})`` with ``c_b`` the completion positions.

    Args:
        model: A causal LM whose forward takes ``input_ids`` and ``attention_mask`` and returns ``.logits``.
        input_ids: (B, T) prompt + completion token ids (padding anywhere the attention mask is 0).
        attention_mask: (B, T) 1 on real tokens.
        completion_mask: (B, T) 1 on the completion tokens to score.
        batch_size: Rows per forward pass.

    Returns:
        (B,) float32 NLL on the device of ``input_ids``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    out: list[Tensor] = []
    for start in range(0, input_ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        ids = input_ids[rows].to(device)  # (b, T)
        logits = model(input_ids=ids, attention_mask=attention_mask[rows].to(device)).logits  # (b, T, V)
        out.append(completion_nll(logits, ids, completion_mask[rows].to(device)).to(input_ids.device))  # (b,)
    if not out:
        return torch.zeros(0, dtype=torch.float32, device=input_ids.device)
    return torch.cat(out)  # (B,)
